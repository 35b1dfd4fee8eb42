module example.com/dsh-go-agent

go 1.19

require dsh.dev/dsh-system-prompt/clients/go v0.0.0

replace dsh.dev/dsh-system-prompt/clients/go => ../../clients/go
