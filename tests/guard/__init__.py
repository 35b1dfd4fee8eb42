"""Who may call and how much: auth, TLS, roles, quotas per client, fair shares."""
