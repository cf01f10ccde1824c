"""The user commands that read a run's results without the operator: `fleettune report`,
`fleettune predict` and `fleettune export` (each a module with ``main(argv) -> int``)."""
