"""Anthropic's Messages API: request translation (schemas), answers and events (views), routes."""
