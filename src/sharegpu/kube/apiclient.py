"""The one way sharegpu's Kubernetes components reach the API server: in-cluster credentials (the
pod's ServiceAccount) when running in a pod, else the kubeconfig (`$KUBECONFIG`, ~/.kube/config).

Each client gets a Configuration of its own rather than the `kubernetes` package's global one,
so a test can hand a component a client for a stand-in API server next to a real one. Each says
which component it is in its User-Agent (`sharegpu-deviceplugin/0.4.0`), so an API server's audit
log and its request metrics name the component rather than the Python client library.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import urllib3

from sharegpu.errors import ConfigError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

REQUEST_TIMEOUT_S = 15.0  # one list or patch; a watch has its own (its resync period and some)


def api_client(component: str) -> ApiClient:
    """A client of the cluster's API server for `component` (`deviceplugin`, `dra`, `extender`);
    ConfigError (one line) when there is none to find."""
    from kubernetes import client, config

    import sharegpu

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as in_cluster:
        try:
            config.load_kube_config(client_configuration=configuration, persist_config=False)
        except (config.ConfigException, OSError) as err:
            raise ConfigError(
                f"no Kubernetes API server to talk to: not in a pod ({in_cluster}) and no usable "
                f"kubeconfig ({err}); set KUBECONFIG, or run without the API server (--pods-file)"
            ) from err
    api = client.ApiClient(configuration)
    api.user_agent = user_agent(component, sharegpu.__version__)
    return api


def user_agent(component: str, version: str) -> str:
    """What a component's requests call it: `sharegpu-<component>/<version>`."""
    return f"sharegpu-{component}/{version}"


def server_of(api: ApiClient) -> str:
    """The API server's address, for error messages."""
    return str(getattr(api.configuration, "host", "") or "the API server")


def failure(err: BaseException, api: ApiClient) -> str:
    """What went wrong with a call to the API server, in one line: its status and message, or
    that it does not answer."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(err, ApiException):
        message = str(err.reason or "")
        try:
            status = json.loads(err.body or "")
            message = str(status.get("message") or message) if isinstance(status, dict) else message
        except ValueError:
            pass
        return f"{err.status} {message}".strip()
    if isinstance(err, urllib3.exceptions.HTTPError | OSError):
        reason = getattr(err, "reason", None) or err
        return f"{server_of(api)} does not answer ({type(err).__name__}: {reason})"
    return f"{type(err).__name__}: {err}"
