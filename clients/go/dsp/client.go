// Connect, its options, the Client and Scope, and the registration methods.

package dsp

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// DefaultAddress is where Connect goes without an address and without $DSP_ADDRESS.
const DefaultAddress = "127.0.0.1:50051"

// readyTimeout bounds WaitForReady without a timeout of its own.
const readyTimeout = 30 * time.Second

type options struct {
	token       string
	tls         *tls.Config
	waitReady   time.Duration
	callTimeout time.Duration
	clientName  string
	dial        []grpc.DialOption
	logger      Logger
	localCache  bool
	// WithLocalCacheBytes'
	localCacheBytes int
}

// Option configures Connect.
type Option func(*options)

// WithToken sends `authorization: Bearer <token>` on every call.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithTLS connects over TLS with config; a config holding a client
// certificate makes it mutual TLS.
func WithTLS(config *tls.Config) Option { return func(o *options) { o.tls = config } }

// WithWaitForReady waits up to timeout (30 s when 0) for the sidecar to come
// up, instead of failing at once with UNAVAILABLE when it cannot be reached.
func WithWaitForReady(timeout time.Duration) Option {
	return func(o *options) {
		if timeout <= 0 {
			timeout = readyTimeout
		}
		o.waitReady = timeout
	}
}

// WithCallTimeout bounds what the sidecar answers at once (opening a session,
// a listener, a change stream or a prompt watch, a registration, a disposal);
// default 10 s.
// Past it, or past the ctx's deadline when that comes first (the error then
// names the caller's deadline; not a disposal's, which its ctx does not bound),
// the call fails UNAVAILABLE (SIDECAR_UNAVAILABLE) and, for a registration,
// update or disposal, the client opens a new session and replays.
func WithCallTimeout(timeout time.Duration) Option {
	return func(o *options) { o.callTimeout = timeout }
}

// WithClientName names this client in the sidecar's logs; default go-<pid>.
func WithClientName(name string) Option { return func(o *options) { o.clientName = name } }

// WithDialOptions adds gRPC dial options (interceptors, keepalive, ...).
func WithDialOptions(dial ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, dial...) }
}

// Connect opens a session with the sidecar at address (HOST:PORT or
// unix:PATH; "" means $DSP_ADDRESS, else 127.0.0.1:50051). It fails with
// UNAVAILABLE when the sidecar cannot be reached, unless WithWaitForReady.
// ctx bounds connecting; the client outlives it until Close.
func Connect(ctx context.Context, address string, opts ...Option) (*Client, error) {
	o := options{callTimeout: DefaultCallTimeout, clientName: fmt.Sprintf("go-%d", os.Getpid()), logger: quiet{}}
	for _, opt := range opts {
		opt(&o)
	}
	if address == "" {
		address = os.Getenv("DSP_ADDRESS")
	}
	if address == "" {
		address = DefaultAddress
	}
	cc, err := grpc.Dial(target(address), dialOptions(address, o)...)
	if err != nil {
		return nil, invalid("cannot connect to %s: %v", address, err)
	}
	c := newConn(cc, o.clientName, o.callTimeout)
	c.log = o.logger
	opened := make(chan error, 1)
	go func() {
		if o.waitReady > 0 {
			opened <- c.openWhenReady(ctx, address, o.waitReady)
		} else {
			opened <- c.open(o.callTimeout)
		}
	}()
	select {
	case err = <-opened:
		if err != nil {
			c.close()
			return nil, err
		}
	case <-ctx.Done():
		go func() { <-opened; c.close() }() // what opens meanwhile ends with it
		return nil, fromRPC(ctx.Err())
	}
	client := &Client{registrar{c: c}}
	if o.localCache {
		if err := keepLocally(ctx, client, o.logger, o.localCacheBytes); err != nil {
			c.close()
			return nil, err
		}
	}
	return client, nil
}

// target is address as a gRPC target; unix:PATH is dialled by dialOptions.
func target(address string) string {
	if strings.HasPrefix(address, "unix:") {
		return "passthrough:///" + address
	}
	return address
}

func dialOptions(address string, o options) []grpc.DialOption {
	dial := []grpc.DialOption{}
	if o.tls != nil {
		dial = append(dial, grpc.WithTransportCredentials(credentials.NewTLS(o.tls)))
	} else {
		dial = append(dial, grpc.WithInsecure())
	}
	if o.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{token: o.token, secure: o.tls != nil}))
	}
	if path := strings.TrimPrefix(address, "unix:"); path != address {
		dial = append(dial, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}))
	}
	return append(dial, o.dial...)
}

// bearer is the token as per-call metadata.
type bearer struct {
	token  string
	secure bool
}

// GetRequestMetadata sends the token on every call.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false so that a token also works over plain
// loopback or a unix socket, where the sidecar usually listens.
func (b bearer) RequireTransportSecurity() bool { return false }

// Client is a session with the sidecar; registrations made through it are
// global. It is safe for concurrent use.
type Client struct {
	registrar
}

// SessionID is the current session's id (a new one after a reconnect).
func (c *Client) SessionID() string {
	c.c.mu.Lock()
	defer c.c.mu.Unlock()
	if c.c.session == nil {
		return ""
	}
	return c.c.session.id
}

// Connected is false while the connection is down and being re-established.
func (c *Client) Connected() bool {
	c.c.mu.Lock()
	defer c.c.mu.Unlock()
	return c.c.connected
}

// Close ends the session: the sidecar disposes everything it registered. Idempotent.
func (c *Client) Close() error {
	c.c.close()
	return nil
}

// Scope opens a handle on scope key; registrations made through it land in
// that scope's layer. WithParent binds the key's parent the first time one is given.
func (c *Client) Scope(ctx context.Context, key string, opts ...ScopeOption) (*Scope, error) {
	request := &pb.OpenScopeRequest{Key: key}
	for _, opt := range opts {
		opt(request)
	}
	r := &registration{}
	r.make = func(ctx context.Context, sessionID, _ string) (string, *listenerStream, error) {
		request.SessionId = sessionID
		reply, err := c.c.rpc.OpenScope(ctx, request)
		r.revision = reply.GetRevision()
		return reply.GetScopeId(), nil, answerError(ctx, err, "OpenScope")
	}
	if err := c.c.register(ctx, r); err != nil {
		return nil, err
	}
	return &Scope{registrar: registrar{c: c.c, scope: r}, Key: key, Parent: request.ParentKey}, nil
}

// ScopeOption configures a scope handle.
type ScopeOption func(*pb.OpenScopeRequest)

// WithParent names the scope's parent key.
func WithParent(parent string) ScopeOption {
	return func(r *pb.OpenScopeRequest) { r.ParentKey = parent }
}

// Scope is a handle on a scope key: registrations made through it go to that
// scope's layer and are disposed with the handle.
type Scope struct {
	registrar
	// Key is the scope key.
	Key string
	// Parent is the parent key this handle asked for, or "".
	Parent string
}

// Dispose disposes the handle and all made through it, whatever ctx does (as Registration's). Idempotent.
func (s *Scope) Dispose(ctx context.Context) error {
	return s.c.dispose(ctx, s.scope)
}

// registrar holds the registration methods shared by Client (the global layer) and Scope.
type registrar struct {
	c     *conn
	scope *registration
}

// Complete makes the section the exact, complete prompt.
func Complete() SectionOption {
	return sectionFlag(func(r *pb.RegisterSectionRequest) { r.Complete = true })
}

// Section contributes a prompt section with static text; its Handle updates the text.
func (r *registrar) Section(ctx context.Context, name string, order float64, text string, opts ...SectionOption) (*Handle[string], error) {
	request, a := r.sectionRequest(name, order, opts)
	if err := a.static(); err != nil {
		return nil, err
	}
	request.TextSource = &pb.RegisterSectionRequest_Text{Text: text}
	return registerValue(ctx, r, request, "", r.c.rpc.RegisterSection, textUpdate(func(text string) {
		request.TextSource = &pb.RegisterSectionRequest_Text{Text: text}
	}))
}

// SectionFunc contributes a prompt section whose text provider runs at every
// assembly that needs it. Options: Complete, WithCallbackTimeout (its own time),
// WithFailurePolicy, WithCache.
func (r *registrar) SectionFunc(ctx context.Context, name string, order float64, text TextFunc, opts ...SectionOption) (*Handle[string], error) {
	request, a := r.sectionRequest(name, order, opts)
	dynamic, err := r.dynamic(text, a)
	if err != nil {
		return nil, err
	}
	request.TextSource = &pb.RegisterSectionRequest_Dynamic{Dynamic: dynamic}
	return registerValue(ctx, r, request, dynamic.ProviderKey, r.c.rpc.RegisterSection, textUpdate(nil))
}

func (r *registrar) sectionRequest(name string, order float64, opts []SectionOption) (*pb.RegisterSectionRequest, asked) {
	request := &pb.RegisterSectionRequest{Name: name, Order: order}
	var a asked
	for _, opt := range opts {
		opt.applySection(request, &a)
	}
	return request, a
}

// Context contributes an ordered runtime context with static text.
func (r *registrar) Context(ctx context.Context, name string, order float64, text string) (*Handle[string], error) {
	request := &pb.RegisterContextRequest{Name: name, Order: order, TextSource: &pb.RegisterContextRequest_Text{Text: text}}
	return registerValue(ctx, r, request, "", r.c.rpc.RegisterContext, textUpdate(func(text string) {
		request.TextSource = &pb.RegisterContextRequest_Text{Text: text}
	}))
}

// ContextFunc contributes a runtime context whose text provider runs at every
// assembly that needs it. Options: WithCallbackTimeout (its own time),
// WithFailurePolicy, WithCache.
func (r *registrar) ContextFunc(ctx context.Context, name string, order float64, text TextFunc, opts ...ProviderOption) (*Handle[string], error) {
	dynamic, err := r.dynamic(text, providerAsked(opts))
	if err != nil {
		return nil, err
	}
	request := &pb.RegisterContextRequest{Name: name, Order: order,
		TextSource: &pb.RegisterContextRequest_Dynamic{Dynamic: dynamic}}
	return registerValue(ctx, r, request, dynamic.ProviderKey, r.c.rpc.RegisterContext, textUpdate(nil))
}

// Variable contributes {{name}} with a static value.
func (r *registrar) Variable(ctx context.Context, name, value string) (*VariableHandle, error) {
	request := &pb.RegisterVariableRequest{Name: name, ValueSource: &pb.RegisterVariableRequest_Value{Value: value}}
	return r.variable(ctx, request, "")
}

// VariableUnset contributes {{name}} with no value for now (a render that
// uses it fails) until its handle's Update gives it one.
func (r *registrar) VariableUnset(ctx context.Context, name string) (*VariableHandle, error) {
	request := &pb.RegisterVariableRequest{Name: name, ValueSource: &pb.RegisterVariableRequest_NoValue{NoValue: &pb.NoValue{}}}
	return r.variable(ctx, request, "")
}

// VariableFunc contributes {{name}} with a provider run at every assembly that
// needs it. Options: WithCallbackTimeout (its own time), WithFailurePolicy,
// WithCache.
func (r *registrar) VariableFunc(ctx context.Context, name string, value VariableFunc, opts ...ProviderOption) (*VariableHandle, error) {
	dynamic, err := r.dynamic(value, providerAsked(opts))
	if err != nil {
		return nil, err
	}
	request := &pb.RegisterVariableRequest{Name: name,
		ValueSource: &pb.RegisterVariableRequest_Dynamic{Dynamic: dynamic}}
	return r.variable(ctx, request, dynamic.ProviderKey)
}

func (r *registrar) variable(ctx context.Context, request *pb.RegisterVariableRequest, key string) (*VariableHandle, error) {
	static := key == ""
	handle, err := registerValue(ctx, r, request, key, r.c.rpc.RegisterVariable, textUpdate(func(value string) {
		if static {
			request.ValueSource = &pb.RegisterVariableRequest_Value{Value: value}
		}
	}))
	if err != nil {
		return nil, err
	}
	return &VariableHandle{Handle: *handle, request: request, static: static}, nil
}

// VariableHandle is a variable's handle: Update gives it a value, Unset
// takes the value away ("no value for this assembly" from then on).
type VariableHandle struct {
	Handle[string]
	request *pb.RegisterVariableRequest
	static  bool
}

// Unset replaces the value with "no value", in place like Update.
func (h *VariableHandle) Unset(ctx context.Context) (uint64, error) {
	update := &pb.UpdateRequest{Value: &pb.UpdateRequest_NoValue{NoValue: &pb.NoValue{}}}
	return h.c.update(ctx, h.r, update, func() {
		if h.static {
			h.request.ValueSource = &pb.RegisterVariableRequest_NoValue{NoValue: &pb.NoValue{}}
		}
	})
}

// Tools contributes a static tool list (KnownNames nil: the schemas' names).
func (r *registrar) Tools(ctx context.Context, tools ToolProviderResult) (*Handle[ToolProviderResult], error) {
	if err := checkTools(tools); err != nil {
		return nil, err
	}
	request := &pb.RegisterToolsRequest{Source: &pb.RegisterToolsRequest_Result{Result: resultToProto(tools)}}
	return registerValue(ctx, r, request, "", r.c.rpc.RegisterTools, func(tools ToolProviderResult) (*pb.UpdateRequest, func(), error) {
		if err := checkTools(tools); err != nil {
			return nil, nil, err
		}
		message := resultToProto(tools)
		apply := func() { request.Source = &pb.RegisterToolsRequest_Result{Result: message} }
		return &pb.UpdateRequest{Value: &pb.UpdateRequest_Tools{Tools: message}}, apply, nil
	})
}

// ToolsFunc contributes a tool provider run at every assembly. Options:
// ToolsName (its label), WithCallbackTimeout (its own time), WithFailurePolicy,
// WithCache.
func (r *registrar) ToolsFunc(ctx context.Context, tools ToolsFunc, opts ...ProviderOption) (*Handle[ToolProviderResult], error) {
	a := providerAsked(opts)
	dynamic, err := r.dynamic(tools, a)
	if err != nil {
		return nil, err
	}
	name := a.name
	if name == "" {
		name = funcName(tools)
	}
	request := &pb.RegisterToolsRequest{Name: label(name),
		Source: &pb.RegisterToolsRequest_Dynamic{Dynamic: dynamic}}
	return registerValue(ctx, r, request, dynamic.ProviderKey, r.c.rpc.RegisterTools, func(ToolProviderResult) (*pb.UpdateRequest, func(), error) {
		return &pb.UpdateRequest{}, func() {}, nil // the sidecar refuses it: NOT_UPDATABLE
	})
}

// checkTools refuses parameters that are not JSON before anything is sent.
func checkTools(tools ToolProviderResult) error {
	for _, tool := range tools.Schemas {
		if len(tool.ParametersJSON) > 0 && !json.Valid([]byte(tool.ParametersJSON)) {
			return invalid("tool %q: parameters are not JSON", tool.Name)
		}
	}
	return nil
}

// SuppressRuntimeContext suppresses runtime context here until disposed.
func (r *registrar) SuppressRuntimeContext(ctx context.Context) (*Registration, error) {
	request := &pb.SuppressRuntimeContextRequest{}
	reg, err := register(ctx, r, request, "", r.c.rpc.SuppressRuntimeContext)
	if err != nil {
		return nil, err
	}
	return &Registration{c: r.c, r: reg}, nil
}

// OnAssemble installs a waterfall listener (see Listener). ctx bounds the
// install alone: the listener runs on after it ends, until disposed. Options:
// Prepend, Global, ListenerName, WithCallbackTimeout, WithFailurePolicy, WithCache.
func (r *registrar) OnAssemble(ctx context.Context, listener Listener, opts ...ListenerOption) (*Registration, error) {
	start := &pb.ListenStart{Name: label(funcName(listener)), Features: []string{featureToolSlots, featurePartSlots, featureCallbackCache}}
	var a asked
	for _, opt := range opts {
		opt.applyListener(start, &a)
	}
	seconds, policy, err := a.sent()
	if err != nil {
		return nil, err
	}
	cache, err := a.cachePolicy()
	if err != nil {
		return nil, err
	}
	start.TimeoutS, start.FailurePolicy, start.Cache = seconds, policy, cache
	reg := &registration{scope: r.scope}
	reg.make = func(ctx context.Context, sessionID, scopeID string) (string, *listenerStream, error) {
		start.SessionId, start.ScopeId = sessionID, scopeID
		return startListener(ctx, r.c, reg, listener, start)
	}
	if err := r.c.register(ctx, reg); err != nil {
		return nil, err
	}
	return &Registration{c: r.c, r: reg}, nil
}

// scoped is every registration request: the session and the layer it goes to.
type scoped interface {
	*pb.RegisterSectionRequest | *pb.RegisterContextRequest | *pb.RegisterVariableRequest |
		*pb.RegisterToolsRequest | *pb.SuppressRuntimeContextRequest | *pb.RegisterRuleRequest
}

type registered interface {
	GetRegistrationId() string
	GetRevision() uint64
}

func setSession(request any, sessionID, scopeID string) {
	switch m := request.(type) {
	case *pb.RegisterSectionRequest:
		m.SessionId, m.ScopeId = sessionID, scopeID
	case *pb.RegisterContextRequest:
		m.SessionId, m.ScopeId = sessionID, scopeID
	case *pb.RegisterVariableRequest:
		m.SessionId, m.ScopeId = sessionID, scopeID
	case *pb.RegisterToolsRequest:
		m.SessionId, m.ScopeId = sessionID, scopeID
	case *pb.SuppressRuntimeContextRequest:
		m.SessionId, m.ScopeId = sessionID, scopeID
	case *pb.RegisterRuleRequest:
		m.SessionId, m.ScopeId = sessionID, scopeID
	}
}

func register[I scoped, O registered](ctx context.Context, r *registrar, request I, key string,
	call func(context.Context, I, ...grpc.CallOption) (O, error)) (*registration, error) {
	reg := &registration{scope: r.scope, providerKey: key}
	reg.make = func(ctx context.Context, sessionID, scopeID string) (string, *listenerStream, error) {
		setSession(request, sessionID, scopeID)
		reply, err := call(ctx, request)
		if err != nil {
			return "", nil, answerError(ctx, err, "a registration")
		}
		reg.revision = reply.GetRevision()
		return reply.GetRegistrationId(), nil, nil
	}
	if err := r.c.register(ctx, reg); err != nil {
		return nil, err
	}
	return reg, nil
}

func registerValue[I scoped, O registered, V any](ctx context.Context, r *registrar, request I, key string,
	call func(context.Context, I, ...grpc.CallOption) (O, error),
	update func(V) (*pb.UpdateRequest, func(), error)) (*Handle[V], error) {
	reg, err := register(ctx, r, request, key, call)
	if err != nil {
		return nil, err
	}
	return &Handle[V]{Registration: Registration{c: r.c, r: reg}, update: update}, nil
}
