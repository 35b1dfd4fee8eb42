package dsp_test

import (
	"context"
	"io"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// nextEvent is the stream's next change, which must be a ChangeEvent.
func nextEvent(t *testing.T, changes *dsp.ChangeStream) dsp.ChangeEvent {
	t.Helper()
	change, err := changes.Next(within(t, 10*time.Second))
	check(t, err)
	event, ok := change.(dsp.ChangeEvent)
	if !ok {
		t.Fatalf("want a ChangeEvent, got %#v", change)
	}
	return event
}

func TestChangeEventsAreFilteredAndInRevisionOrder(t *testing.T) {
	client := connect(t, shared(t))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.InScope("go-watched", false)))
	defer changes.Close()
	sections := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.OfKinds("section")))
	defer sections.Close()

	must[*dsp.Handle[string]](t)(client.Section(bg, "elsewhere", 1, "Not in the scope."))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-watched"))
	handle := must[*dsp.Handle[string]](t)(scope.Section(bg, "watched", 1, "Watched."))
	must[*dsp.VariableHandle](t)(scope.Variable(bg, "name", "v"))
	must[uint64](t)(handle.Update(bg, "Changed."))
	check(t, handle.Dispose(bg))

	want := []struct {
		kind   dsp.ChangeKind
		action dsp.ChangeAction
		name   string
	}{
		{"scope", "registered", "go-watched"}, {"section", "registered", "watched"},
		{"variable", "registered", "name"}, {"section", "updated", "watched"}, {"section", "unregistered", "watched"},
	}
	previous := changes.Revision
	for _, w := range want {
		event := nextEvent(t, changes)
		if event.Kind != w.kind || event.Action != w.action || event.Name != w.name || event.Revision <= previous {
			t.Fatalf("got %+v, want %+v after revision %d", event, w, previous)
		}
		if event.Kind == "section" && event.Scope != "go-watched" {
			t.Fatalf("the event names its scope: %+v", event)
		}
		previous = event.Revision
	}
	for _, name := range []string{"elsewhere", "watched", "watched", "watched"} {
		if event := nextEvent(t, sections); event.Kind != "section" || event.Name != name {
			t.Fatalf("the kinds filter: %+v, want %s", event, name)
		}
	}
}

func TestAChangeStreamResumesAfterARestartWithTheResyncedSnapshot(t *testing.T) {
	s, restart := restartable(t)
	client := connect(t, s, dsp.WithCallTimeout(2*time.Second))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.OfKinds("section")))
	defer changes.Close()
	must[*dsp.Handle[string]](t)(client.Section(bg, "kept", 1, "Kept."))
	first := nextEvent(t, changes)
	incarnation := changes.Incarnation()

	restart()
	var resynced *dsp.ChangesResynced
	for resynced == nil {
		change, err := changes.Next(within(t, 20*time.Second))
		check(t, err)
		if r, ok := change.(dsp.ChangesResynced); ok {
			resynced = &r
		}
	}
	if resynced.Reason != "restarted" || changes.Incarnation() == incarnation || changes.Incarnation() == "" {
		t.Fatalf("a restart is told as one: %+v, incarnation %q then %q", resynced, incarnation, changes.Incarnation())
	}
	// The snapshot, and the events after it, hold the replayed section: it is back.
	waitFor(t, "the replayed section", func() bool {
		for _, info := range resynced.Snapshot.Registrations {
			if info.Name == "kept" {
				return true
			}
		}
		ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
		defer cancel()
		change, err := changes.Next(ctx)
		event, ok := change.(dsp.ChangeEvent)
		return err == nil && ok && event.Name == "kept" && event.Action == "registered"
	})
	if first.Revision == 0 {
		t.Fatal("revisions start above zero")
	}
}

func TestResumingAfterARevisionReplaysTheChangesMissed(t *testing.T) {
	client := connect(t, shared(t))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.InScope("go-resume", false)))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-resume"))
	nextEvent(t, changes)
	last, incarnation := changes.LastRevision(), changes.Incarnation()
	changes.Close()
	if _, err := changes.Next(bg); err != io.EOF {
		t.Fatalf("a closed stream ends with io.EOF, not %v", err)
	}
	must[*dsp.Handle[string]](t)(scope.Section(bg, "while-away", 1, "Missed."))

	resumed := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.InScope("go-resume", false), dsp.AfterRevision(last, incarnation)))
	defer resumed.Close()
	if event := nextEvent(t, resumed); event.Name != "while-away" || event.Revision <= last {
		t.Fatalf("the replayed change: %+v", event)
	}

	stale := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.InScope("go-resume", false), dsp.AfterRevision(last, "another-incarnation")))
	defer stale.Close()
	change, err := stale.Next(within(t, 10*time.Second))
	check(t, err)
	if resynced, ok := change.(dsp.ChangesResynced); !ok || len(resynced.Snapshot.Registrations) != 2 {
		t.Fatalf("another incarnation's revision resyncs with a snapshot of the scope: %#v", change)
	}
}

func TestSnapshotListsRegistrationsWithTheirValues(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-listed"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "listed", 5, "Listed."))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(scope.Tools(bg, dsp.ToolProviderResult{
		Schemas: []dsp.ToolSchema{{Name: "t", ParametersJSON: `{}`}}, KnownNames: []string{"t", "u"},
	}))
	snapshot := must[*dsp.Snapshot](t)(client.Snapshot(bg, dsp.InScope("go-listed", false), dsp.WithValues()))
	if len(snapshot.Registrations) != 3 || snapshot.Revision == 0 || snapshot.Incarnation == "" {
		t.Fatalf("the listing: %+v", snapshot)
	}
	section := snapshot.Registrations[1]
	if section.Kind != "section" || section.Name != "listed" || *section.Order != 5 || *section.Text != "Listed." {
		t.Fatalf("the section as listed: %+v", section)
	}
	tools := snapshot.Registrations[2]
	if tools.Kind != "tools" || tools.Tools == nil || len(tools.Tools.KnownNames) != 2 {
		t.Fatalf("the tools as listed: %+v", tools)
	}
}
