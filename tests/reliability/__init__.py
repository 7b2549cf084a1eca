"""Reliability suites: fault injection (faultfs), histories and their checker, the torture
driver and its workers. See docs/RELIABILITY.md."""
