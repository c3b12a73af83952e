"""`lagless serve`: lag as Prometheus metrics, a Burrow-like JSON API and a dashboard.

view.py builds what is shown (pure), sampler.py samples the broker in a loop, metrics.py and
api.py render views, server.py serves them over HTTP, dashboard.html is the page at /,
service.py runs the sampler and the server together.
"""
