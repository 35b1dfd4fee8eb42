"""Adapters: an assembled prompt and its tools as a model call or an agent framework wants them.

Provider adapters (no SDK imported; plain JSON values for the SDK's create call)::

    from dsh_system_prompt import adapters
    rendered = await client.render(scope, report=True, report_key="conv-7")
    request = adapters.anthropic_messages(rendered, messages, report_key="conv-7")
    response = await anthropic.messages.create(model=..., max_tokens=1024, **request.params)
    await client.report_usage(response.usage, **request.report)

`openai_chat`, `openai_responses`, `anthropic_messages` and `gemini` keep the assembly's tool
order and schema bytes and put the runtime-context snapshot after the cached prefix
(docs/adapters.md). Framework adapters live in their own modules, each importing its
framework only when imported itself: `adapters.openai_agents`, `adapters.pydantic_ai`,
`adapters.langchain`.
"""

from ._providers import (
    Prompt,
    ProviderRequest,
    anthropic_messages,
    gemini,
    openai_chat,
    openai_responses,
    parameters,
)

__all__ = [
    "Prompt",
    "ProviderRequest",
    "anthropic_messages",
    "gemini",
    "openai_chat",
    "openai_responses",
    "parameters",
]
