"""The benchmark-regression suite: probes (`probes`) produce named metrics, compared with
the shipped baselines (`judge`), so a change that makes searches worse or the code
slower is caught the night it lands (`nas regress`, the nightly-regression flow)."""
