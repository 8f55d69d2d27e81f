"""The code-execution API (Otari protocol, contract v1): a thin HTTP layer over the runtime."""
