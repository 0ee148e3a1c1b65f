"""The API's routers: jobs (tenant), admin (tenants and tokens), system (health, metrics, plans, cluster)."""
