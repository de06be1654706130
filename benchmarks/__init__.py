"""`runwatch bench` and its suites, and the stand-ins they and the tests use.

Nothing in the running bot imports this package: it needs the test extras (the MLflow server,
the local Slack server), and ships only for `runwatch bench`. :mod:`benchmarks.run` dispatches
the suites; :mod:`benchmarks.report` writes their sections into BENCHMARKS.md;
:mod:`benchmarks.devslack` and :mod:`benchmarks.devmlflow` are the local Slack Web API server
and the MLflow tracking server the end-to-end tests start.
"""
