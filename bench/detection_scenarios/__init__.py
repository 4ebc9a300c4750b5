"""bench/detection.py's parts: scenarios built with the simulator, driven through the real wire
messages into the controller's offline detection, scored against what was injected, beside a
SuperBench-style static rule on the same probe results."""
