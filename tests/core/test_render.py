"""Strict interpolation (contract.md section 4), in the client and on the sidecar.

Each rule runs twice: through the pure `dsp.render_prompt` /
`dsp.render_context_snapshot` on a hand-built `dsp.PromptAssembly`, and through
`client.render()` on a sidecar holding the same sections, contexts and
variables as static registrations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import dsh_system_prompt as dsp
import grpc
import pytest
from helpers import ClientFactory, ClientOf, SidecarFactory, failure, refusal, rejection

HEADER = "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."

Parts = Sequence[tuple[str, str]]


class Renderer:
    """Renders sections, contexts and variables; `where` is "client" or "sidecar"."""

    def __init__(self, where: str, make_sidecar: SidecarFactory) -> None:
        self.where = where
        self._make_sidecar = make_sidecar

    async def __call__(
        self,
        sections: Parts = (),
        contexts: Parts = (),
        variables: Mapping[str, str | None] | None = None,
    ) -> tuple[str, str]:
        """(prompt, context snapshot)."""
        variables = dict(variables or {})
        if self.where == "client":
            assembly = dsp.PromptAssembly(
                sections=[dsp.AssembledSection(name, text) for name, text in sections],
                contexts=[dsp.AssembledContext(name, text) for name, text in contexts],
                variables=variables,
            )
            return dsp.render_prompt(assembly), dsp.render_context_snapshot(assembly)
        # No identity; the configured persona is empty, so it is dropped at render.
        sidecar = await self._make_sidecar(include_harness_identity=False)
        async with dsp.connect(sidecar.address) as client:
            for order, (name, text) in enumerate(sections, start=1):
                await client.section(name, order, text)
            for order, (name, text) in enumerate(contexts, start=1):
                await client.context(name, order, text)
            for name, value in variables.items():
                await client.variable(name, value)
            rendered = await client.render()
        return rendered.prompt, rendered.context_snapshot

    async def prompt(self, text: str, **variables: str | None) -> str:
        """The rendered prompt of one section named "s"."""
        prompt, _ = await self(sections=[("s", text)], variables=variables)
        return prompt

    async def failure(
        self, sections: Parts = (), contexts: Parts = (), **variables: str | None
    ) -> str:
        """The message of the RenderError rendering fails with."""
        with pytest.raises(dsp.RenderError) as caught:
            await self(sections=sections, contexts=contexts, variables=variables)
        error = caught.value
        assert isinstance(error, dsp.SystemPromptError)
        assert error.code == grpc.StatusCode.FAILED_PRECONDITION
        if self.where == "sidecar":
            assert error.reason == "RENDER_FAILED"
        return error.message


@pytest.fixture(params=["client", "sidecar"])
def render(request: pytest.FixtureRequest, make_sidecar: SidecarFactory) -> Renderer:
    return Renderer(request.param, make_sidecar)


# -- substitution ---------------------------------------------------------------------


async def test_a_complete_group_with_a_registered_name_is_replaced(render: Renderer) -> None:
    assert await render.prompt("Model: {{model}}.", model="deepseek-v4") == "Model: deepseek-v4."


async def test_every_occurrence_is_replaced(render: Renderer) -> None:
    text = "{{a}}-{{b}}-{{a}}{{b}}"
    assert await render.prompt(text, a="1", b="2") == "1-2-12"


async def test_names_with_digits_and_underscores_are_replaced(render: Renderer) -> None:
    assert await render.prompt("{{git_state2}}", git_state2="clean") == "clean"


async def test_text_without_references_is_unchanged(render: Renderer) -> None:
    text = "Plain {text} with } and { braces, and a } } gap."
    assert await render.prompt(text) == text


async def test_an_empty_value_is_substituted(render: Renderer) -> None:
    assert await render.prompt("[{{empty}}]", empty="") == "[]"


async def test_substituted_values_are_not_scanned_again(render: Renderer) -> None:
    text = "{{outer}} / {{braces}}"
    rendered = await render.prompt(text, outer="{{inner}}", braces="{{ }} {{{x}}}")
    assert rendered == "{{inner}} / {{ }} {{{x}}}"


async def test_a_group_followed_by_a_stray_brace_keeps_the_brace(render: Renderer) -> None:
    assert await render.prompt("{{model}}}", model="m") == "m}"


# -- unknown and valueless variables --------------------------------------------------


def unknown(variable: str, where: str, registered: str) -> str:
    """The render failure for `variable`, unknown in `where`, with `registered` listed."""
    named = "{{" + variable + "}}"
    return f'unknown prompt variable "{named}" in {where}; registered variables: {registered}'


async def test_an_unknown_variable_fails_listing_the_registered_ones(render: Renderer) -> None:
    message = await render.failure(sections=[("persona", "I am {{modle}}.")], model="m")
    assert message == unknown("modle", 'section "persona"', "model")


async def test_the_registered_variables_are_all_listed(render: Renderer) -> None:
    message = await render.failure(sections=[("persona", "{{nope}}")], cwd="/", model="m")
    assert message == unknown("nope", 'section "persona"', "cwd, model")


async def test_an_unknown_variable_with_none_registered_says_none(render: Renderer) -> None:
    message = await render.failure(sections=[("persona", "I am {{model}}.")])
    assert message == unknown("model", 'section "persona"', "(none)")


async def test_a_valueless_variable_counts_as_registered(render: Renderer) -> None:
    message = await render.failure(sections=[("persona", "{{model}}")], cwd=None)
    assert message == unknown("model", 'section "persona"', "cwd")


@pytest.mark.parametrize("name", ["constructor", "hasownproperty", "valueof", "proto"])
async def test_object_prototype_names_are_unknown_unless_registered(
    render: Renderer, name: str
) -> None:
    message = await render.failure(sections=[("persona", f"{{{{{name}}}}}")])
    assert message == unknown(name, 'section "persona"', "(none)")


async def test_a_registered_constructor_variable_is_replaced(render: Renderer) -> None:
    assert await render.prompt("{{constructor}}", constructor="c") == "c"


async def test_a_variable_without_a_value_fails(render: Renderer) -> None:
    message = await render.failure(sections=[("persona", "cwd: {{cwd}}")], cwd=None)
    assert message == 'prompt variable "{{cwd}}" has no value for this assembly (section "persona")'


async def test_a_valueless_variable_that_is_not_referenced_is_fine(render: Renderer) -> None:
    assert await render.prompt("no reference", cwd=None) == "no reference"


# -- malformed references -------------------------------------------------------------


@pytest.mark.parametrize(
    "group",
    ["{{ model }}", "{{}}", "{{ }}", "{{Model}}", "{{1model}}", "{{_model}}", "{{mo-del}}"],
)
async def test_a_complete_group_with_an_invalid_name_is_malformed(
    render: Renderer, group: str
) -> None:
    message = await render.failure(sections=[("s", f"x {group} y")], model="m")
    assert message == f'malformed prompt variable reference "{group}" in section "s"'


async def test_an_opening_that_closes_no_group_fails_when_a_closing_follows(
    render: Renderer,
) -> None:
    message = await render.failure(sections=[("s", "x {{{model}}} y")], model="m")
    assert message.startswith('malformed prompt variable reference at "{{')
    assert 'in section "s"' in message


async def test_an_unclosed_opening_before_a_later_group_fails(render: Renderer) -> None:
    message = await render.failure(sections=[("s", "a {{ b {{model}}")], model="m")
    assert message.startswith('malformed prompt variable reference at "')


async def test_an_opening_with_a_closing_much_later_fails(render: Renderer) -> None:
    message = await render.failure(sections=[("s", "{{ {\n\nlater }}")])
    assert message.startswith('malformed prompt variable reference at "')


async def test_a_lone_opening_with_no_closing_after_it_stays_literal(render: Renderer) -> None:
    assert await render.prompt("Type {{ to start.") == "Type {{ to start."


async def test_a_closing_before_a_lone_opening_does_not_count(render: Renderer) -> None:
    assert await render.prompt("a }} b {{model}} c {{ d", model="m") == "a }} b m c {{ d"


async def test_an_opening_with_a_single_closing_brace_stays_literal(render: Renderer) -> None:
    assert await render.prompt("{{model}") == "{{model}"


# -- sections: dropping and joining ---------------------------------------------------


async def test_sections_are_joined_with_one_blank_line(render: Renderer) -> None:
    prompt, _ = await render(sections=[("a", "One."), ("b", "Two."), ("c", "Three.")])
    assert prompt == "One.\n\nTwo.\n\nThree."


async def test_empty_sections_are_dropped(render: Renderer) -> None:
    prompt, _ = await render(sections=[("a", ""), ("b", "One."), ("c", ""), ("d", "Two.")])
    assert prompt == "One.\n\nTwo."


async def test_a_section_that_renders_empty_is_dropped(render: Renderer) -> None:
    prompt, _ = await render(
        sections=[("a", "One."), ("b", "{{empty}}"), ("c", "Two.")], variables={"empty": ""}
    )
    assert prompt == "One.\n\nTwo."


async def test_no_sections_render_an_empty_prompt(render: Renderer) -> None:
    prompt, _ = await render()
    assert prompt == ""


async def test_an_error_names_the_first_failing_section(render: Renderer) -> None:
    message = await render.failure(sections=[("fine", "ok"), ("broken", "{{nope}}")])
    assert 'in section "broken"' in message


# -- the runtime-context snapshot -----------------------------------------------------


async def test_the_context_snapshot_starts_with_the_header_and_a_blank_line(
    render: Renderer,
) -> None:
    _, snapshot = await render(contexts=[("policy", "Mode: {{mode}}.")], variables={"mode": "plan"})
    assert snapshot == f"{HEADER}\n\nMode: plan."


async def test_contexts_are_joined_with_one_blank_line(render: Renderer) -> None:
    _, snapshot = await render(contexts=[("a", "One."), ("b", ""), ("c", "Two.")])
    assert snapshot == f"{HEADER}\n\nOne.\n\nTwo."


async def test_the_context_snapshot_is_empty_with_no_contexts(render: Renderer) -> None:
    _, snapshot = await render(sections=[("s", "text")])
    assert snapshot == ""


async def test_the_context_snapshot_is_empty_when_every_context_is_empty(
    render: Renderer,
) -> None:
    _, snapshot = await render(contexts=[("a", ""), ("b", "{{empty}}")], variables={"empty": ""})
    assert snapshot == ""


async def test_contexts_stay_out_of_the_prompt_and_sections_out_of_the_snapshot(
    render: Renderer,
) -> None:
    prompt, snapshot = await render(sections=[("s", "Section.")], contexts=[("c", "Context.")])
    assert (prompt, snapshot) == ("Section.", f"{HEADER}\n\nContext.")


async def test_an_unknown_variable_in_a_context_names_the_context(render: Renderer) -> None:
    message = await render.failure(contexts=[("policy", "Mode: {{mode}}.")])
    assert message == unknown("mode", 'context "policy"', "(none)")


async def test_a_valueless_variable_in_a_context_names_the_context(render: Renderer) -> None:
    message = await render.failure(contexts=[("policy", "{{cwd}}")], cwd=None)
    assert message == 'prompt variable "{{cwd}}" has no value for this assembly (context "policy")'


async def test_a_malformed_group_in_a_context_names_the_context(render: Renderer) -> None:
    message = await render.failure(contexts=[("policy", "{{ mode }}")])
    assert message == 'malformed prompt variable reference "{{ mode }}" in context "policy"'


async def test_a_dangling_opening_in_a_context_names_the_context(render: Renderer) -> None:
    message = await render.failure(contexts=[("policy", "{{{mode}}}")], mode="m")
    assert message.startswith('malformed prompt variable reference at "')
    assert 'in context "policy"' in message


# -- the sidecar's render -------------------------------------------------------------


async def test_the_sidecar_renders_the_default_prompt_as_the_identity(client: dsp.Client) -> None:
    rendered = await client.render()
    assert rendered.prompt == "You are an AI agent powered by DeepSeek Harness."
    assert rendered.context_snapshot == ""


async def test_the_sidecar_returns_the_assembly_it_rendered(client: dsp.Client) -> None:
    await client.section("rules", 10, "Use {{model}}.")
    await client.context("policy", 1, "Mode: plan.")
    await client.variable("model", "deepseek-v4")
    rendered = await client.render()
    assert rendered.assembly == await client.assemble()
    assert rendered.prompt == dsp.render_prompt(rendered.assembly)
    assert rendered.context_snapshot == dsp.render_context_snapshot(rendered.assembly)


async def test_the_configured_persona_is_interpolated(client_of: ClientOf) -> None:
    async with client_of(persona="You run on {{model}}.", include_harness_identity=False) as client:
        await client.variable("model", "deepseek-v4")
        rendered = await client.render()
    assert rendered.prompt == "You run on deepseek-v4."


async def test_a_persona_referencing_an_unregistered_variable_fails_to_render(
    client_of: ClientOf,
) -> None:
    async with client_of(persona="You run on {{model}}.") as client:
        with pytest.raises(dsp.RenderError) as caught:
            await client.render()
        assembly = await client.assemble()  # assembling alone does not interpolate
    assert caught.value.message == unknown("model", 'section "deployment:persona"', "(none)")
    assert assembly.sections[1] == dsp.AssembledSection(
        dsp.PERSONA_SECTION, "You run on {{model}}."
    )


async def test_the_sidecar_renders_with_the_scopes_variables(client: dsp.Client) -> None:
    await client.section("who", 10, "Agent: {{who}}.")
    await client.variable("who", "global")
    agent = await client.scope("agent-1")
    await agent.variable("who", "agent-1")
    assert (await client.render(scope="agent-1")).prompt.endswith("Agent: agent-1.")
    assert (await client.render()).prompt.endswith("Agent: global.")


# -- malformed static templates are refused at registration -----------------------------


@pytest.mark.parametrize("text", ["Hi {{ model }}.", "{{{model}}}", "{{}}", "a {{ b {{model}}"])
async def test_a_static_section_with_a_malformed_reference_is_refused_at_registration(
    client: dsp.Client, connect: ClientFactory, text: str
) -> None:
    error = await rejection(client.section("poison", 1, text))
    assert isinstance(error, dsp.RenderError)
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "RENDER_FAILED"
    assert error.message.startswith("malformed prompt variable reference")
    assert 'in section "poison"' in error.message
    other = await connect()
    await other.section("rules", 2, "Be precise.")
    assert (await other.render()).prompt.endswith("Be precise.")  # nothing was left behind


async def test_a_static_context_with_a_malformed_reference_is_refused_at_registration(
    client: dsp.Client,
) -> None:
    error = await rejection(client.context("policy", 1, "Mode: {{ mode }}."))
    assert failure(error) == refusal(
        "RENDER_FAILED", 'malformed prompt variable reference "{{ mode }}" in context "policy"'
    )
    assert (await client.render()).context_snapshot == ""


async def test_an_unknown_variable_is_accepted_at_registration_and_renders_once_registered(
    client: dsp.Client,
) -> None:
    await client.section("model", 1, "Model: {{model}}.")
    with pytest.raises(dsp.RenderError):
        await client.render()
    await client.variable("model", "deepseek-v4")
    assert (await client.render()).prompt.endswith("Model: deepseek-v4.")
