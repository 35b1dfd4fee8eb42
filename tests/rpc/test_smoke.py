"""The sidecar answers an assembly end to end through the Python client."""

import dsh_system_prompt as dsp


async def test_default_assembly_has_identity_and_empty_persona(client: dsp.Client) -> None:
    assembly = await client.assemble()
    assert assembly == dsp.PromptAssembly(
        sections=[
            dsp.AssembledSection(
                "harness:identity", "You are an AI agent powered by DeepSeek Harness."
            ),
            dsp.AssembledSection(dsp.PERSONA_SECTION, ""),
        ],
        contexts=[],
        tools=[],
        variables={},
    )
    assert dsp.render_prompt(assembly) == "You are an AI agent powered by DeepSeek Harness."
