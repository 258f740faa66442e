"""Prefect: flows, cached tasks, deployments and the server guard. The library (`nas` outside this package) never imports Prefect."""
