"""API bodies: what the gateway accepts and returns, one module per area.

Request bodies forbid unknown fields (a typo is a 400, not a silently ignored option); responses are
plain frozen Structs. The OpenAPI document is generated from these types.
"""
