"""The project's scripts (data tenants, container images, cost estimates): run from the repo root as modules,
`python -m scripts.<name>`, so they import the package, and the tests' loopback servers (`tests.servers`), from there."""
