"""What the registry keeps per registration: the value, and a small fixed cost over it.

A sidecar holds every pod's registrations for its life, so the cost per entry is paid
thousands of times: no closure per entry (a remover each cost more than the entry), and
slotted entries. Measured with tracemalloc on the registry alone, in plain Python.
"""

from __future__ import annotations

import gc
import tracemalloc

from dsh_system_prompt_server.registry import Registry

OWNER = "session-memory"
ENTRIES = 2_000
TEXT_BYTES = 324  # a typical section's text
# The registry's share of issue 35's target of 800 bytes per static registration over its
# text in a sidecar (the name and the text's copy from the request come on top); 883
# bytes with a remover closure per entry and unslotted entries, 183 without.
MAX_OVERHEAD_BYTES = 400


def test_a_static_scoped_section_costs_the_registry_at_most_400_bytes_over_its_text() -> None:
    registry = Registry()
    handles = [registry.open_scope(OWNER, f"scope-{index}").id for index in range(20)]
    # made before the count: what the caller hands over is not the registry's cost
    names = [f"section-{index:05d}" for index in range(ENTRIES)]
    texts = [f"{index:05d} " + "t" * (TEXT_BYTES - 6) for index in range(ENTRIES)]
    text_bytes = sum(map(len, texts))  # the values, which the registry keeps as they are
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index, (name, text) in enumerate(zip(names, texts, strict=True)):
            registry.register_section(OWNER, handles[index % 20], name, index, text)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del names, texts
    overhead = grown / ENTRIES - text_bytes / ENTRIES
    assert overhead <= MAX_OVERHEAD_BYTES, f"{overhead:.0f} bytes per registration over its text"


def test_disposing_every_registration_gives_back_what_they_held() -> None:
    registry = Registry()
    handles = [registry.open_scope(OWNER, f"scope-{index}").id for index in range(20)]
    for index in range(ENTRIES):
        registry.register_section(OWNER, handles[index % 20], f"s-{index}", index, "text")
    assert registry.dispose_owner(OWNER) == ENTRIES + 20
    assert registry.registration_count() == 2  # the built-in sections
    assert registry.scope_keys() == []
    assert registry.plan("scope-0").sections == registry.plan(None).sections
