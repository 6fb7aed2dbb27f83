-- Lookups by an agent's key (the image server's gate: which machine's
-- agent proved this key in TLS) and by the endpoint agents call (the
-- fleet page's and /metrics' agents per callback endpoint).
CREATE INDEX machine_agent_started_public_key ON machine_agent_started (agent_public_key);
CREATE INDEX machine_agent_started_endpoint ON machine_agent_started (agent_endpoint);
