"""Work the export overlaps with its main loop: the source's checksum and the next tensors' loading,
each in a daemon thread (hashlib and the GGUF dequantizer release the GIL)."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path


def sha256_in_background(path: Path) -> tuple[threading.Thread, dict]:
    """Hash the source in a thread (hashlib releases the GIL) while the weights are converted.

    A GGUF file hashes as its bytes (the `sha256sum` of the file); a folder as the bytes of its
    config.json and *.safetensors files in name order."""
    result = {}
    files = [path] if path.is_file() else [path / "config.json", *sorted(path.glob("*.safetensors"))]

    def run():
        digest = hashlib.sha256()
        for file in files:
            with open(file, "rb") as f:
                while block := f.read(1 << 22):
                    digest.update(block)
        result["sha256"] = digest.hexdigest()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


class Prefetch:
    """Loads tensors `names` in order in a daemon thread, at most `ahead` tensors ahead of `get`
    (so memory stays bounded). An exception in the thread is raised again by `get`."""

    def __init__(self, load, names: list[str], dtype, ahead: int = 8):
        import queue

        self._queue: queue.Queue = queue.Queue(maxsize=ahead)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(load, names, dtype), daemon=True)
        self._thread.start()

    def _run(self, load, names, dtype):
        import queue

        for name in names:
            try:
                item = (name, load(name, dtype))
            except BaseException as exc:  # handed to the consumer, which raises it
                item = (name, exc)
            while not self._stopped.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stopped.is_set() or isinstance(item[1], BaseException):
                return

    def get(self, name: str):
        got, value = self._queue.get()
        if isinstance(value, BaseException):
            raise value
        assert got == name, (got, name)
        return value

    def stop(self) -> None:
        self._stopped.set()
