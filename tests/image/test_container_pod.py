"""The pods of deploy/kubernetes/, built by hand from the manifests (kube.py), with real agents.

An agent in the agent container and the sidecar share what the manifest says they share
(the emptyDir at /run/dsp, or the pod's loopback), and the agent gets its prompt; a config
edit reaches it live; SIGTERM drains; a sidecar killed and restarted gets its agent back.
"""

from __future__ import annotations

import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from agents import Agent, Lines, Running
from engine import ROOT, Cleanup, podman
from kube import HOST_CLI, Pod, build_pod, config_files

EXAMPLE = ROOT / "examples" / "python"
HERE = Path(__file__).resolve().parent
MANIFESTS = ["agent-unix-socket.yaml", "agent-tcp.yaml"]


def example_output(lines: Lines) -> str:
    """The prompt examples/python/agent.py prints: after its first line, before the two
    blank lines ahead of the runtime context (which holds the clock, so it differs)."""
    assert "registered" in lines.next(60)
    printed = "".join(lines.until("type a line", 30)[:-1])
    prompt, separator, _ = printed.rpartition("\n\n\n")
    assert separator, f"no context after the prompt in {printed!r}"
    return prompt


def reference_prompt(folder: Path) -> str:
    """What the same example agent prints against a sidecar on this host, with the same
    ConfigMap: the prompt the agent in the pod must get, byte for byte."""
    config = folder / "sidecar.toml"
    config.write_text(config_files()["sidecar.toml"])
    serve = subprocess.Popen(
        [str(HOST_CLI), "serve", "--listen", f"unix:{folder}/dsp.sock", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    python = HOST_CLI.parent / "python"
    agent = subprocess.Popen(
        [str(python), str(EXAMPLE / "agent.py"), f"unix:{folder}/dsp.sock"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        return example_output(Lines(agent))
    finally:
        for process in (agent, serve):
            process.kill()
            process.wait(10)


def pod_agent(pod: Pod) -> Agent:
    container = f"{pod.pod}-agent"
    mounts = {"/agent": HERE}
    return Agent(
        container, pod.agent_command(container, "python", "/agent/pod_agent.py", mounts=mounts)
    )


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_the_example_agent_gets_its_prompt_in_the_pod(
    manifest: str, made: Cleanup, tmp_path: Path
) -> None:
    pod = build_pod(manifest, tmp_path / "pod", made)
    if manifest == "agent-tcp.yaml":
        # The kubelet's gRPC probe dials the pod's IP: the sidecar listens beyond loopback.
        assert pod.probe("readinessProbe") and pod.probe("livenessProbe")
    container = f"{pod.pod}-agent"
    mounts = {"/example": EXAMPLE}
    agent = Running(
        container, pod.agent_command(container, "python", "/example/agent.py", mounts=mounts)
    )
    try:
        in_pod = example_output(agent.lines)
        # The pod's stop: SIGTERM reaches the agent, PID 1 of its container, which leaves.
        started = time.monotonic()
        podman("stop", "--time", "10", container)
        assert agent.process.wait(15) == 0
        assert time.monotonic() - started < 5, "the agent ignored SIGTERM"
    finally:
        agent.close()
    assert "You run on deepseek-v4. Be precise and brief." in in_pod
    (tmp_path / "host").mkdir()
    assert in_pod == reference_prompt(tmp_path / "host")


def test_a_config_edit_reaches_the_next_assembly_and_a_bad_one_changes_nothing(
    made: Cleanup, tmp_path: Path
) -> None:
    pod = build_pod("agent-unix-socket.yaml", tmp_path / "pod", made)
    agent = pod_agent(pod)
    try:
        before = agent.ask("render")["prompt"]
        good = config_files()["sidecar.toml"].replace(
            'persona = ""', 'persona = "You serve the pod test."'
        )
        pod.config.update({"sidecar.toml": good})
        after = wait_for_prompt(agent, lambda prompt: prompt != before, 15)
        assert "You serve the pod test." in after
        assert after.replace("You serve the pod test.", "").strip() != ""

        # Two bad edits, each with a persona that must never be seen: a file that is not
        # TOML, and a value out of range. Neither may change anything, even in part.
        unseen = good.replace("You serve the pod test.", "You must not see this.")
        for bad in (
            unseen + "watch_buffer = \n",
            unseen.replace("watch_buffer = 1024", "watch_buffer = -1"),
        ):
            pod.config.update({"sidecar.toml": bad})
            time.sleep(3)  # three of the sidecar's config polls (--config-poll 1)
            assert agent.ask("render")["prompt"] == after
        assert pod.sidecar.logs().count("config reload from") >= 2
        assert pod.sidecar.running()
    finally:
        agent.close()


def wait_for_prompt(agent: Agent, wanted: object, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while True:
        prompt: str = agent.ask("render")["prompt"]
        if callable(wanted) and wanted(prompt):
            return prompt
        assert time.monotonic() < deadline, f"the prompt stayed {prompt!r}"
        time.sleep(0.2)


def test_sigterm_lets_assemblies_in_flight_finish_and_exits_zero(
    made: Cleanup, tmp_path: Path
) -> None:
    grace_s = tomllib.loads(config_files()["sidecar.toml"])["shutdown_grace_s"]
    pod = build_pod("agent-unix-socket.yaml", tmp_path / "pod", made)
    agent = pod_agent(pod)
    try:
        agent.send("slow 4")
        assert agent.answer(15) == {"started": 4}
        started = time.monotonic()
        # The runtime's stop: SIGTERM (the image's STOPSIGNAL), SIGKILL only after 30 s.
        podman("stop", "--time", "30", pod.sidecar.name)
        stopped_s = time.monotonic() - started
        finished = agent.answer(15)["finished"]
        assert len(finished) == 4
        assert all(text.endswith("Slow context, 2.0 s.") for text in finished), finished
        assert pod.sidecar.exit_code() == 0
        assert stopped_s < grace_s, f"stopping took {stopped_s:.1f} s"
    finally:
        agent.close()


def test_a_sidecar_killed_and_restarted_gets_the_agent_back(made: Cleanup, tmp_path: Path) -> None:
    pod = build_pod("agent-unix-socket.yaml", tmp_path / "pod", made)
    agent = pod_agent(pod)
    try:
        assert agent.ask("remember the restart") == {"remembered": "the restart"}
        before = agent.ask("render")["prompt"]
        assert "Remember: the restart" in before
        pod.restart_sidecar()
        # The first assembly after the restart waits out the reconnect and must already
        # see every registration replayed, the updated memory included.
        assert agent.ask("render", 40)["prompt"] == before
    finally:
        agent.close()
