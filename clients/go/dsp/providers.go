// Dynamic providers: TextFunc, VariableFunc and ToolsFunc, and their answers.

package dsp

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// TextFunc provides a section's or context's text at each assembly that needs
// it. ctx ends when the sidecar stops waiting (the caller cancelled the
// assembly, or its deadline passed); an error fails the assembly with its message.
type TextFunc func(ctx context.Context, assembly AssembleContext) (string, error)

// VariableFunc provides a variable's value at each assembly that needs it;
// ok false means "no value for this assembly".
type VariableFunc func(ctx context.Context, assembly AssembleContext) (value string, ok bool, err error)

// ToolsFunc provides tool schemas at each assembly.
type ToolsFunc func(ctx context.Context, assembly AssembleContext) (ToolProviderResult, error)

// providers are this client's dynamic providers, by the key the sidecar quotes
// back. They stay across reconnects, so a replayed registration finds its provider.
type providers struct {
	mu    sync.Mutex
	byKey map[string]any
	keys  int
}

func newProviders() *providers { return &providers{byKey: map[string]any{}} }

// add keeps provider; the returned key is what the sidecar asks for.
func (p *providers) add(provider any) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys++
	key := "p" + strconv.Itoa(p.keys)
	p.byKey[key] = provider
	return key
}

func (p *providers) remove(key string) {
	if key == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byKey, key)
}

func (p *providers) get(key string) any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byKey[key]
}

// answer evaluates every call of request, concurrently; a provider's failure is
// its answer, never this client's.
func (p *providers) answer(ctx context.Context, request *pb.ProvideRequest) []*pb.ProvidedValue {
	values := make([]*pb.ProvidedValue, len(request.GetCalls()))
	p.each(ctx, request, func(i int, value *pb.ProvidedValue) { values[i] = value }) // each i once
	return values
}

// each evaluates every call of request, concurrently, and hands the value of call
// i to ready as soon as it is in (from that provider's goroutine); it returns once
// every value has been handed.
func (p *providers) each(ctx context.Context, request *pb.ProvideRequest, ready func(i int, value *pb.ProvidedValue)) {
	calls := request.GetCalls()
	assembly, err := contextFromProto(request.GetContext())
	if err != nil {
		for i, call := range calls {
			ready(i, failed(call.GetProviderKey(), err)) // no provider can answer
		}
		return
	}
	if len(calls) == 1 {
		ready(0, p.value(ctx, calls[0], assembly))
		return
	}
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Add(1)
		go func(i int, call *pb.ProvideCall) {
			defer wg.Done()
			ready(i, p.value(ctx, call, assembly))
		}(i, call)
	}
	wg.Wait()
}

func (p *providers) value(ctx context.Context, call *pb.ProvideCall, assembly AssembleContext) (value *pb.ProvidedValue) {
	key := call.GetProviderKey()
	defer func() {
		if panicked := recover(); panicked != nil {
			value = failed(key, fmt.Errorf("the provider panicked: %v", panicked))
		}
	}()
	switch provider := p.get(key).(type) {
	case nil:
		return failed(key, fmt.Errorf("the provider was disposed in this client"))
	case TextFunc:
		if kind := call.GetKind(); kind != pb.ProviderKind_PROVIDER_KIND_SECTION && kind != pb.ProviderKind_PROVIDER_KIND_CONTEXT {
			return failed(key, fmt.Errorf("a text provider was asked for %v", kind))
		}
		text, err := provider(ctx, assembly)
		if err != nil {
			return failed(key, err)
		}
		return &pb.ProvidedValue{ProviderKey: key, Value: &pb.ProvidedValue_Text{Text: text}}
	case VariableFunc:
		if call.GetKind() != pb.ProviderKind_PROVIDER_KIND_VARIABLE {
			return failed(key, fmt.Errorf("a variable provider was asked for %v", call.GetKind()))
		}
		text, ok, err := provider(ctx, assembly)
		if err != nil {
			return failed(key, err)
		}
		if !ok {
			return &pb.ProvidedValue{ProviderKey: key, Value: &pb.ProvidedValue_NoValue{NoValue: &pb.NoValue{}}}
		}
		return &pb.ProvidedValue{ProviderKey: key, Value: &pb.ProvidedValue_VariableValue{VariableValue: text}}
	case ToolsFunc:
		if call.GetKind() != pb.ProviderKind_PROVIDER_KIND_TOOLS {
			return failed(key, fmt.Errorf("a tool provider was asked for %v", call.GetKind()))
		}
		result, err := provider(ctx, assembly)
		if err != nil {
			return failed(key, err)
		}
		return &pb.ProvidedValue{ProviderKey: key, Value: &pb.ProvidedValue_Tools{Tools: resultToProto(result)}}
	default:
		return failed(key, fmt.Errorf("this client holds no provider of kind %v", call.GetKind()))
	}
}

func failed(key string, err error) *pb.ProvidedValue {
	return &pb.ProvidedValue{ProviderKey: key, Value: &pb.ProvidedValue_Error{Error: &pb.ProviderError{Message: err.Error()}}}
}
