"""What is asked of a deployment: scenario files, real traces, arrivals and lengths, request content, `Request`."""
