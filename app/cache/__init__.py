"""Cache layers. Each one follows the contract in :mod:`app.cache.base`."""
