"""The policy server (FastAPI app, ``evoharness-agent serve``), its client and the batch processor.

Needs the ``server`` extra (``pip install 'evoharness-agent[server]'``). Import the modules
themselves: ``server.app`` (FastAPI) and ``server.client`` (httpx only) load different libraries.
"""
