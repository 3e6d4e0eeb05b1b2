"""A JVM error raised out of the detector's foreachBatch, told in a few lines.

When a query stops, Spark interrupts the batch in flight; the writer's call into the JVM then fails with a
``Py4JJavaError`` whose text carries the whole Java stack (about 12,000 characters seen). Spark decides whether
the query was stopped or failed by matching that text with a regular expression that recurses once per
character (``StreamExecution.PROXY_ERROR``), and on a text that long the stream thread dies of a
``StackOverflowError`` instead of stopping cleanly. The writer re-raises such an error as :class:`JvmCallFailed`,
whose text keeps what Spark and a reader need: the call, and each exception of the chain with its message
(the interruption among them), without the stack frames (logged by the writer).
"""

from __future__ import annotations

# what Spark's check looks for after the call: an interruption somewhere in the chain
INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                 "java.nio.channels.ClosedByInterruptException")  # fmt: skip
MAX_MESSAGE = 300  # characters kept of each exception's message


class JvmCallFailed(RuntimeError):
    """A call into the JVM failed; the message is :func:`compact_jvm_error`'s."""


def compact_jvm_error(text: str) -> str:
    """``str()`` of a Py4JJavaError ("An error occurred while calling o12.getResult.\\n: <exception>\\n\\tat ...
    Caused by: ...") as its first line and its exception chain, one line each, without stack frames."""
    lines = text.splitlines()
    call = lines[0].strip() if lines else "a JVM call failed"
    chain = [line[2:] for line in lines[1:2] if line.startswith(": ")]
    chain += [line.removeprefix("Caused by: ") for line in lines if line.startswith("Caused by: ")]
    told = [link if len(link) <= MAX_MESSAGE else link[:MAX_MESSAGE] + "..." for link in map(str.strip, chain)]
    compact = "py4j.protocol.Py4JJavaError: " + call + "".join(f"\n: {link}" for link in told)
    if interrupted(text) and not interrupted(compact):  # named only where the chain's lines do not show it
        compact += "\n: " + next(name for name in INTERRUPTIONS if name in text)
    return compact


def interrupted(text: str) -> bool:
    """Whether the chain names an interruption (the query is stopping), as Spark's check does."""
    return any(name in text for name in INTERRUPTIONS)
