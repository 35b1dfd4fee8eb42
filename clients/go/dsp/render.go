// Strict {{variable}} interpolation, with the core's rules and messages.

package dsp

import (
	"strings"

	"google.golang.org/grpc/codes"
)

// Strict {{variable}} interpolation (messages quote names as written, unescaped), as pure functions with the rules and the
// error messages of the sidecar's renderer and the other clients' (the
// contract's section 4): an assembly from Assemble renders here as Render
// renders it there.

// ContextSnapshotHeader opens every non-empty runtime-context snapshot.
const ContextSnapshotHeader = "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."

const (
	sectionSeparator = "\n\n"
	snippetLimit     = 40 // code points of a malformed opening quoted in its error
)

// RenderPrompt interpolates every section, drops the empty ones and joins the
// rest with one blank line. An unknown, valueless or malformed reference is an
// *Error with ReasonRenderFailed.
func RenderPrompt(a *Assembly) (string, error) {
	return renderParts(a.Sections, variableMap(a.Variables), "section")
}

// RenderContextSnapshot is the runtime-context snapshot of a, or "" when no
// context text is left.
func RenderContextSnapshot(a *Assembly) (string, error) {
	body, err := renderParts(a.Contexts, variableMap(a.Variables), "context")
	if err != nil || body == "" {
		return "", err
	}
	return ContextSnapshotHeader + sectionSeparator + body, nil
}

// variables are an assembly's values by name, and the names in its order.
type variables struct {
	values map[string]*string
	names  []string
}

func variableMap(list []Variable) variables {
	v := variables{values: make(map[string]*string, len(list))}
	for _, variable := range list {
		if _, seen := v.values[variable.Name]; !seen {
			v.names = append(v.names, variable.Name)
		}
		v.values[variable.Name] = variable.Value
	}
	return v
}

func renderParts(parts []Part, vars variables, noun string) (string, error) {
	rendered := make([]string, 0, len(parts))
	for _, part := range parts {
		text, err := interpolate(part.Text, vars, noun+` "`+part.Name+`"`)
		if err != nil {
			return "", err
		}
		if text != "" {
			rendered = append(rendered, text)
		}
	}
	return strings.Join(rendered, sectionSeparator), nil
}

func renderError(format string, args ...any) *Error {
	return newError(codes.FailedPrecondition, ReasonRenderFailed, format, args...)
}

// interpolate replaces every {{name}} in text; where names the part for errors.
// Substituted values are never scanned again.
func interpolate(text string, vars variables, where string) (string, error) {
	if !strings.Contains(text, "{{") {
		return text, nil
	}
	var out strings.Builder
	position := 0
	for {
		at := strings.Index(text[position:], "{{")
		if at < 0 {
			break
		}
		start := position + at
		reference, name, complete := group(text, start)
		if !complete {
			end := strings.Index(text[start+2:], "}}")
			if end < 0 {
				break // a lone "{{" with no "}}" after it stays literal
			}
			return "", renderError(`malformed prompt variable reference at "%s" in %s`,
				snippet(text, start, start+2+end), where)
		}
		value, err := resolve(reference, name, vars, where)
		if err != nil {
			return "", err
		}
		out.WriteString(text[position:start])
		out.WriteString(value)
		position = start + len(reference)
	}
	out.WriteString(text[position:])
	return out.String(), nil
}

// group is the complete group "{{", no braces, "}}" at text[start:], if there is one.
func group(text string, start int) (reference, name string, complete bool) {
	brace := strings.IndexAny(text[start+2:], "{}")
	if brace < 0 {
		return "", "", false
	}
	end := start + 2 + brace
	if !strings.HasPrefix(text[end:], "}}") {
		return "", "", false
	}
	return text[start : end+2], text[start+2 : end], true
}

func resolve(reference, name string, vars variables, where string) (string, error) {
	if !isVariableName(name) {
		return "", renderError(`malformed prompt variable reference "%s" in %s`, reference, where)
	}
	value, registered := vars.values[name]
	if !registered {
		names := strings.Join(vars.names, ", ")
		if names == "" {
			names = "(none)"
		}
		return "", renderError(`unknown prompt variable "%s" in %s; registered variables: %s`, reference, where, names)
	}
	if value == nil {
		return "", renderError(`prompt variable "%s" has no value for this assembly (%s)`, reference, where)
	}
	return *value, nil
}

// isVariableName is whether name matches ^[a-z][a-z0-9_]*$.
func isVariableName(name string) bool {
	for i, c := range name {
		if !(c >= 'a' && c <= 'z' || i > 0 && (c >= '0' && c <= '9' || c == '_')) {
			return false
		}
	}
	return name != ""
}

// snippet is text from the "{{" at start through the run of closing braces at
// end, at most snippetLimit code points.
func snippet(text string, start, end int) string {
	stop := end + 2
	for stop < len(text) && text[stop] == '}' {
		stop++
	}
	points := []rune(text[start:stop])
	if len(points) > snippetLimit {
		return string(points[:snippetLimit]) + "…"
	}
	return string(points)
}
