"""A JVM error out of the detector's foreachBatch is told short enough for Spark's check of a stop.

Spark's own regular expression (``StreamExecution.PROXY_ERROR``, Spark 4) is run by Java, in a thread of the
default stack size as Spark's stream thread is: on the text a stopped batch used to give it (the Java stack in a
Py4JJavaError, about 12,000 characters) it overflows the stack, as in the outage tests' logs; on the compact text it
finds the interruption, so the query stops cleanly."""

from __future__ import annotations

import subprocess
from pathlib import Path

from khipu.detector.jvm_errors import compact_jvm_error, interrupted
from khipu.localstack.broker import java_binary

FRAME = "\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:70)\n"
STOPPED = (
    "An error occurred while calling o1201.getResult.\n"
    ": org.apache.spark.SparkException: Exception thrown in awaitResult: \n" + FRAME * 120
    + "Caused by: java.lang.InterruptedException\n" + FRAME * 20
)  # fmt: skip
FAILED = (
    "An error occurred while calling o7.getResult.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: " + "x" * 500 + "\n" + FRAME * 120
    + "Caused by: java.lang.OutOfMemoryError: Java heap space\n" + FRAME * 20
)  # fmt: skip
TRACEBACK = 'Traceback (most recent call last):\n  File "outputs.py", line 209, in __call__\n'
# Spark 4's StreamExecution.PROXY_ERROR, as its source builds it
CHECK = r"""
import java.nio.file.*;
import java.util.regex.*;
public class Check {
  public static void main(String[] args) throws Exception {
    Pattern proxyError = Pattern.compile("py4j.protocol.Py4JJavaError: An error occurred while calling"
        + "((.|\\r\\n|\\r|\\n)*)(java.lang.InterruptedException|java.io.InterruptedIOException|"
        + "java.nio.channels.ClosedByInterruptException)");
    for (String path : args) {
      String text = Files.readString(Path.of(path));
      String[] said = new String[1];
      Thread thread = new Thread(() -> {
        try { said[0] = proxyError.matcher(text).find() ? "match" : "no match"; }
        catch (StackOverflowError e) { said[0] = "overflow"; }
      });
      thread.start();
      thread.join();
      System.out.println(said[0]);
    }
  }
}
"""


def spark_check(tmp_path: Path, texts: list[str]) -> list[str]:
    source = tmp_path / "Check.java"
    source.write_text(CHECK)
    paths = []
    for n, text in enumerate(texts):
        paths.append(tmp_path / f"{n}.txt")
        paths[-1].write_text(text)
    run = subprocess.run([java_binary(), str(source), *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def test_spark_overflows_on_a_stopped_batchs_java_stack_and_reads_the_compact_text(tmp_path: Path) -> None:
    raw = TRACEBACK + "py4j.protocol.Py4JJavaError: " + STOPPED
    compact = TRACEBACK + "khipu.detector.jvm_errors.JvmCallFailed: " + compact_jvm_error(STOPPED)
    failed = TRACEBACK + "khipu.detector.jvm_errors.JvmCallFailed: " + compact_jvm_error(FAILED)
    said = spark_check(tmp_path, [raw, compact, failed])
    assert said == ["overflow", "match", "no match"]


def test_the_compact_text_keeps_the_call_and_each_exception_of_the_chain() -> None:
    told = compact_jvm_error(STOPPED)
    assert told.splitlines() == [
        "py4j.protocol.Py4JJavaError: An error occurred while calling o1201.getResult.",
        ": org.apache.spark.SparkException: Exception thrown in awaitResult:",
        ": java.lang.InterruptedException",
    ]
    assert interrupted(told) and not interrupted(compact_jvm_error(FAILED))
    failed = compact_jvm_error(FAILED).splitlines()
    assert failed[1].endswith("x...") and len(failed[1]) == len(": ") + 300 + len("...")  # cut at 300 characters
    assert failed[2] == ": java.lang.OutOfMemoryError: Java heap space"
    assert len(compact_jvm_error(STOPPED)) < 200 < len(STOPPED) // 50


def test_an_interruption_named_only_off_the_chains_lines_is_kept() -> None:
    """An interruption Spark would find in the whole text (here in a suppressed exception, indented) is named in the
    compact text too, so that a stopping query is still seen as stopped."""
    text = (
        "An error occurred while calling o9.getResult.\n"
        ": org.apache.spark.SparkException: Exception thrown in awaitResult: \n" + FRAME * 5
        + "\tSuppressed: java.nio.channels.ClosedByInterruptException\n" + FRAME * 3
    )  # fmt: skip
    told = compact_jvm_error(text)
    assert interrupted(text) and interrupted(told)
    assert told.splitlines()[-1] == ": java.nio.channels.ClosedByInterruptException"
