"""Config groups this plugin adds to nasflow's (found through the `nasflow.conf` entry point)."""
