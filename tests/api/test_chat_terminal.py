"""`strata chat` in a pseudo-terminal (pexpect), as a person uses it: two turns, Ctrl-C in the
middle of an answer (the session goes on), /reset, and Ctrl-D to leave. Each forward pass is
slowed to 30 ms (STRATA_FAULT_PASS_DELAY_MS, read by debug builds) so that an answer can be
interrupted halfway."""

import os
import re
import time

import pexpect
import pytest

from conftest import fixtures, strata_bin

STATS = re.compile(r"\[strata\] prompt (\d+) new tokens \((\d+) cached\).*finish: (\w+)")


@pytest.fixture
def chat(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "STRATA_FAULT_PASS_DELAY_MS": "30", "NO_COLOR": "1"}
    model = str(fixtures() / "qwen3-moe-tiny")
    child = pexpect.spawn(
        strata_bin(),
        ["chat", model, "--temp", "0", "-n", "600", "--ignore-eos"],
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 200),
    )
    child.expect_exact("/help for commands")
    yield child
    child.close(force=True)


def turn(child):
    """Waits for a turn's stats line: (new tokens, cached tokens, finish)."""
    child.expect(STATS)
    return int(child.match.group(1)), int(child.match.group(2)), child.match.group(3)


def test_two_turns_an_interrupted_answer_reset_and_leave(chat):
    chat.expect_exact(">>> ")
    chat.sendline("Hello")
    # Let part of the answer out, then Ctrl-C: the answer stops, the chat goes on.
    time.sleep(1.5)
    chat.sendintr()
    first_new, first_cached, finish = turn(chat)
    assert finish == "interrupted"
    assert first_cached == 0 and first_new > 0

    chat.expect_exact(">>> ")
    chat.sendline("Go on")
    time.sleep(1.0)
    chat.sendintr()
    new, cached, finish = turn(chat)
    assert finish == "interrupted"
    # The second turn reuses at least the first prompt and feeds fewer tokens than it holds.
    assert cached >= first_new, (new, cached)
    assert new < cached + new

    chat.expect_exact(">>> ")
    chat.sendline("/reset")
    chat.expect_exact("(conversation cleared)")
    chat.expect_exact(">>> ")
    chat.sendline("Hello")
    time.sleep(0.5)
    chat.sendintr()
    assert turn(chat) == (first_new, 0, "interrupted")

    # Ctrl-C at the prompt says how to leave; Ctrl-D leaves.
    chat.expect_exact(">>> ")
    chat.sendintr()
    chat.expect_exact("Ctrl-D or /bye to leave")
    chat.sendeof()
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0
