"""Files that run inside the vLLM venv (``--backend vllm``), never imported by the builder.

``driver.py`` is started by path with the venv's interpreter, so this folder is its
``sys.path[0]`` and ``osprey_sync_connector`` imports there as a top-level module (the name vLLM's
``kv_connector_module_path`` is given). The driver imports vLLM only inside functions, so the
default test suite unit-tests its pure parts without vLLM; the connector subclasses a vLLM class
and is imported by vLLM alone.
"""
