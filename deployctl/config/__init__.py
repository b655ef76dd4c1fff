"""deploy.yaml: the models, the YAML reader, byte-size units, and the on-host layout.

- ``models``     the pydantic models of deploy.yaml (its sections: ``router``, ``rollout``, ``logs``,
                 ``openai_server``; ``fields``: their frozen base and shared field types).
- ``load``       ``parse_config`` / ``load_config``: deploy.yaml validated into them (ConfigError, exit 3).
- ``units``      byte sizes ("80GiB", "40GB") parsed and formatted.
- ``yamlsource`` YAML with the source line of every key; ``yamledit`` sets one key, keeping the rest.
- ``layout``     where things live under a host's deploy_root, and the runtime's port there.

Import the models from this package (``from deployctl.config import DeployConfig``).
"""
from deployctl.config.load import load_config, parse_config
from deployctl.config.models import (ContainerConfig, DeployConfig, EngineConfig, HostConfig, ModelConfig, ServerConfig,
                                     ServiceConfig, SloConfig)
from deployctl.config.rollout import AnalysisConfig, RolloutConfig
from deployctl.config.router import RouterConfig

__all__ = ["AnalysisConfig", "ContainerConfig", "DeployConfig", "EngineConfig", "HostConfig", "ModelConfig",
           "RolloutConfig", "RouterConfig", "ServerConfig", "ServiceConfig", "SloConfig", "load_config", "parse_config"]
