# The agent image plus Hermes (PyPI hermes-agent, an Agent Client Protocol agent) for
# AGENT_BRAIN=acp: see compose.acp.yaml and "Bring your own agent" in README.md. Another ACP
# agent goes the same way: install it here and point AGENT_ACP_COMMAND at it.
ARG AGENT_IMAGE=mxbridge/agent:latest
FROM ${AGENT_IMAGE}
USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/hermes \
 && /opt/hermes/bin/pip install --no-cache-dir 'hermes-agent[acp,mcp]==0.19.0'
USER 10001:10001
