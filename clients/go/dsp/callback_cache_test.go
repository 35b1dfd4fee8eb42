package dsp_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// Cacheable callbacks on a real sidecar (the Go twin of tests/registry/test_callback_cache.py):
// a provider or listener made WithCache is asked once, and asked again after every change
// that could change its answer, after its own Invalidate, and once its time to live is over.

// counted is a text provider that answers how many times it was asked.
type counted struct{ asked atomic.Int32 }

func (c *counted) text(context.Context, dsp.AssembleContext) (string, error) {
	return fmt.Sprintf("asked %d", c.asked.Add(1)), nil
}

func TestAProviderWithoutWithCacheIsAskedAtEveryAssembly(t *testing.T) {
	client := connect(t, shared(t))
	provider := &counted{}
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 1, provider.text))
	must[*dsp.Assembly](t)(client.Assemble(bg))
	if got := text(must[*dsp.Assembly](t)(client.Assemble(bg)), "dynamic"); got != "asked 2" {
		t.Fatalf("the second assembly: %q", got)
	}
}

func TestARevisionCachedProviderIsAskedOncePerRevision(t *testing.T) {
	client := connect(t, shared(t))
	provider := &counted{}
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 1, provider.text, dsp.WithCache(dsp.CacheRevision)))
	first := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.WithFields(map[string]any{"who": "a"})))
	second := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("other"), dsp.WithFields(map[string]any{"who": "b"})))
	if text(first, "dynamic") != "asked 1" || text(second, "dynamic") != "asked 1" || provider.asked.Load() != 1 {
		t.Fatalf("asked %d times: %q, %q", provider.asked.Load(), text(first, "dynamic"), text(second, "dynamic"))
	}
}

func TestARegistrationAnUpdateAndADisposalDropCachedAnswers(t *testing.T) {
	client := connect(t, shared(t))
	provider := &counted{}
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 1, provider.text, dsp.WithCache(dsp.CacheRevision)))
	must[*dsp.Assembly](t)(client.Assemble(bg))
	other := must[*dsp.Handle[string]](t)(client.Section(bg, "other", 2, "one"))
	wantText(t, client, "dynamic", "asked 2")
	must[uint64](t)(other.Update(bg, "two"))
	wantText(t, client, "dynamic", "asked 3")
	check(t, other.Dispose(bg))
	wantText(t, client, "dynamic", "asked 4")
}

func TestAFieldsCachedProviderIsAskedOncePerContext(t *testing.T) {
	client := connect(t, shared(t))
	var seen []any
	provide := func(_ context.Context, assembly dsp.AssembleContext) (string, error) {
		seen = append(seen, assembly.Get("who"))
		return fmt.Sprintf("for %v", assembly.Get("who")), nil
	}
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 1, provide, dsp.WithCache(dsp.CacheFields)))
	for _, who := range []string{"a", "b", "a", "b"} {
		assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.WithFields(map[string]any{"who": who})))
		if text(assembly, "dynamic") != "for "+who {
			t.Fatalf("for %s: %q", who, text(assembly, "dynamic"))
		}
	}
	if fmt.Sprint(seen) != "[a b]" {
		t.Fatalf("asked for %v", seen)
	}
}

func TestAProviderInvalidatingItsAnswersIsAskedAgainAndTheOthersAreKept(t *testing.T) {
	client := connect(t, shared(t))
	kept, dropped := &counted{}, &counted{}
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "kept", 1, kept.text, dsp.WithCache(dsp.CacheRevision)))
	handle := must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dropped", 2, dropped.text, dsp.WithCache(dsp.CacheRevision)))
	must[*dsp.Assembly](t)(client.Assemble(bg))
	must[*dsp.Assembly](t)(client.Assemble(bg))
	check(t, handle.Invalidate(bg))
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg))
	if text(assembly, "kept") != "asked 1" || text(assembly, "dropped") != "asked 2" {
		t.Fatalf("kept %q, dropped %q", text(assembly, "kept"), text(assembly, "dropped"))
	}
}

func TestACachedVariableAndToolsProviderAreAskedOnce(t *testing.T) {
	client := connect(t, shared(t))
	var variables, tools atomic.Int32
	must[*dsp.VariableHandle](t)(client.VariableFunc(bg, "who", func(context.Context, dsp.AssembleContext) (string, bool, error) {
		variables.Add(1)
		return "me", true, nil
	}, dsp.WithCache(dsp.CacheRevision)))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(client.ToolsFunc(bg, func(context.Context, dsp.AssembleContext) (dsp.ToolProviderResult, error) {
		tools.Add(1)
		return dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "search"}}}, nil
	}, dsp.WithCache(dsp.CacheRevision)))
	for i := 0; i < 3; i++ {
		must[*dsp.Assembly](t)(client.Assemble(bg))
	}
	if variables.Load() != 1 || tools.Load() != 1 {
		t.Fatalf("the variable asked %d times, the tools %d", variables.Load(), tools.Load())
	}
}

func TestATimeToLiveCachedAnswerIsAskedAgainOnceItExpires(t *testing.T) {
	client := connect(t, shared(t))
	provider := &counted{}
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 1, provider.text, dsp.WithCache(dsp.CacheTTL(50*time.Millisecond, false))))
	must[*dsp.Assembly](t)(client.Assemble(bg))
	time.Sleep(100 * time.Millisecond) // past its time to live, however slow the machine
	wantText(t, client, "dynamic", "asked 2")
}

func TestACachedProviderOfAnEndedSessionIsAskedNoMore(t *testing.T) {
	s := shared(t)
	owner, reader := connect(t, s), connect(t, s)
	must[*dsp.Handle[string]](t)(owner.SectionFunc(bg, "cached-owner", 1, (&counted{}).text, dsp.WithCache(dsp.CacheRevision)))
	if text(must[*dsp.Assembly](t)(reader.Assemble(bg)), "cached-owner") != "asked 1" {
		t.Fatal("the owner's section is missing")
	}
	owner.Close()
	if got := text(must[*dsp.Assembly](t)(reader.Assemble(bg)), "cached-owner"); got != "<absent>" {
		t.Fatalf("the ended session's answer is still served: %q", got)
	}
}

// appending is a listener that appends a section saying how often it was invoked.
func appending(name string, invoked *atomic.Int32) dsp.Listener {
	return func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		a.Sections = append(a.Sections, dsp.Part{Name: name, Text: fmt.Sprintf("invoked %d", invoked.Add(1))})
		return next.Tail(a)
	}
}

func TestACachedListenerIsInvokedOnceForTheSameInputAndAgainAfterInvalidate(t *testing.T) {
	client := connect(t, shared(t))
	var invoked atomic.Int32
	listener := must[*dsp.Registration](t)(client.OnAssemble(bg, appending("listened", &invoked), dsp.WithCache(dsp.CacheRevision)))
	wantText(t, client, "listened", "invoked 1")
	wantText(t, client, "listened", "invoked 1")
	check(t, listener.Invalidate(bg))
	wantText(t, client, "listened", "invoked 2")
}

func TestACachedListenerIsInvokedAgainWhenItsInputChanges(t *testing.T) {
	client := connect(t, shared(t))
	var invoked atomic.Int32
	must[*dsp.Registration](t)(client.OnAssemble(bg, appending("listened", &invoked), dsp.WithCache(dsp.CacheFields)))
	wantText(t, client, "listened", "invoked 1")
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.WithFields(map[string]any{"turn": 2})))
	if text(assembly, "listened") != "invoked 2" {
		t.Fatalf("another context's result: %q", text(assembly, "listened"))
	}
}

func TestInvalidateOfAStaticOrDisposedRegistrationDoesNothing(t *testing.T) {
	client := connect(t, shared(t))
	static := must[*dsp.Handle[string]](t)(client.Section(bg, "static", 1, "text"))
	check(t, static.Invalidate(bg))
	dynamic := must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 1, (&counted{}).text, dsp.WithCache(dsp.CacheRevision)))
	check(t, dynamic.Dispose(bg))
	check(t, dynamic.Invalidate(bg))
}

func TestWithCacheOnAStaticValueOrANegativeTimeToLiveIsRefused(t *testing.T) {
	client := connect(t, shared(t))
	_, err := client.Section(bg, "static", 1, "text", dsp.WithCache(dsp.CacheRevision))
	if failed := failure(t, err); failed.Code != codes.InvalidArgument || failed.Reason != dsp.ReasonInvalidValue ||
		failed.Message != "WithCache applies to a provider (a ...Func registration), not to a static value" {
		t.Fatalf("the refusal: %+v", failed)
	}
	_, err = client.SectionFunc(bg, "dynamic", 1, (&counted{}).text, dsp.WithCache(dsp.CacheTTL(-time.Second, false)))
	if failed := failure(t, err); failed.Reason != dsp.ReasonInvalidValue || !strings.Contains(failed.Message, "-1s") {
		t.Fatalf("the refusal: %+v", failed)
	}
	_, err = client.OnAssemble(bg, appending("x", new(atomic.Int32)), dsp.WithCache(dsp.CacheTTL(-time.Second, true)))
	if failed := failure(t, err); failed.Reason != dsp.ReasonInvalidValue {
		t.Fatalf("the refusal: %+v", failed)
	}
}

// ToolsName labels a tools provider in errors, skipped steps, listings and change events.

func TestToolsNameLabelsAToolsProviderInErrorsAndChangeEvents(t *testing.T) {
	s := startSidecar(t, nil)
	client := connect(t, s)
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.OfKinds("tools")))
	defer changes.Close()
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(client.ToolsFunc(bg, func(context.Context, dsp.AssembleContext) (dsp.ToolProviderResult, error) {
		return dsp.ToolProviderResult{}, errors.New("no repository here")
	}, dsp.ToolsName("repo-tools")))
	change := must[dsp.Change](t)(changes.Next(within(t, 10*time.Second)))
	if event, ok := change.(dsp.ChangeEvent); !ok || event.Name != "repo-tools" {
		t.Fatalf("the change event: %+v", change)
	}
	_, err := client.Assemble(bg)
	if failed := failure(t, err); failed.Reason != dsp.ReasonProviderFailed || !strings.Contains(failed.Message, `tools provider "repo-tools"`) {
		t.Fatalf("the failure: %+v", failed)
	}
}

func TestWithoutToolsNameAToolsProviderIsLabelledByItsFunction(t *testing.T) {
	client := connect(t, shared(t))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(client.ToolsFunc(bg, func(context.Context, dsp.AssembleContext) (dsp.ToolProviderResult, error) {
		return dsp.ToolProviderResult{}, errors.New("no repository here")
	}))
	_, err := client.Assemble(bg)
	if failed := failure(t, err); !strings.Contains(failed.Message, `tools provider "dsp_test.TestWithoutToolsNameAToolsProviderIsLabelledByItsFunction.func1"`) {
		t.Fatalf("the failure: %+v", failed)
	}
}

func TestToolsNameOnAnotherProviderIsRefused(t *testing.T) {
	client := connect(t, shared(t))
	_, err := client.ContextFunc(bg, "cwd", 1, (&counted{}).text, dsp.ToolsName("cwd"))
	if failed := failure(t, err); failed.Code != codes.InvalidArgument || failed.Reason != dsp.ReasonInvalidValue {
		t.Fatalf("the refusal: %+v", failed)
	}
}

// wantText fails unless the next assembly's part name reads want.
func wantText(t *testing.T, client *dsp.Client, name, want string) {
	t.Helper()
	if got := text(must[*dsp.Assembly](t)(client.Assemble(bg)), name); got != want {
		t.Fatalf("%s: got %q, want %q", name, got, want)
	}
}
