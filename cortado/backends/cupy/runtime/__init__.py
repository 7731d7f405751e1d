"""The GPU's runtime: device blocks (``blocks``), where a call's feeds are read from (``feeds``) and the executor
that walks the plan, calling each kernel's runner (``executor``; the runners are the targets', ``targets/``)."""
