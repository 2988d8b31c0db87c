"""Many engines behind a dispatcher: routers and the fleet driver."""
