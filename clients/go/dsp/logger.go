// WithLogger: what the client does on its own (reconnects, replays, re-installs), told to a Logger.

package dsp

// Logger hears what the client does on its own, which no call of the caller's
// returns: a lost session, each attempt to reconnect, the replay on the new
// session, a callback the sidecar ejected and its re-install, the local cache
// going off. Its methods are log/slog's: a *slog.Logger (Go 1.21 and later) is
// one, and so is any logger with the same three methods. Each message is a
// constant text; what varies is in args, as slog's key-value pairs.
type Logger interface {
	Debug(msg string, args ...any)
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
}

// WithLogger tells logger what the client does on its own (see Logger):
// Warn for what the caller may want to act on (a session lost, a callback
// ejected, a re-install refused, the local cache off), Info for the reconnect's
// steps, Debug for each session opened and the waits of WithWaitForReady.
// Without it the client says nothing (the Python client logs the same to its
// "dsh_system_prompt" logger).
func WithLogger(logger Logger) Option {
	return func(o *options) {
		if logger != nil {
			o.logger = logger
		}
	}
}

// quiet is the Logger of a client made without WithLogger.
type quiet struct{}

func (quiet) Debug(string, ...any) {}
func (quiet) Info(string, ...any)  {}
func (quiet) Warn(string, ...any)  {}

// ejectedWhy is what the sidecar said of an ejected callback: its message, else its reason.
func ejectedWhy(ejected interface {
	GetMessage() string
	GetReason() string
}) string {
	if message := ejected.GetMessage(); message != "" {
		return message
	}
	return ejected.GetReason()
}
