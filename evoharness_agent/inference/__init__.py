"""The policy's inference backends: the scorer and the sentence encoder on onnxruntime (fp32 or INT8).

:mod:`~evoharness_agent.inference.onnx_export` writes an exported policy directory
(``evoharness-agent export``); :mod:`~evoharness_agent.inference.onnx_runtime` runs one
(``ToolPolicy.load(dir, backend="onnx")``). Both need the ``onnx`` extra.
"""
