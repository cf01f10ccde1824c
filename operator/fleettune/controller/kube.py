"""Blocking Kubernetes API calls the tuning loop needs, returning plain dicts.

Calls are made from worker threads (never on kopf's event loop). Lists are read raw
(`_preload_content=False`) to skip the client's slow model deserialisation.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from fleettune import GROUP, PLURAL, VERSION


def load_api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class Kube:
    def __init__(self, api: client.ApiClient | None = None) -> None:
        self.api = api or load_api_client()

    @cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @cached_property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    @cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @staticmethod
    def _items(resp: Any) -> list[dict[str, Any]]:
        return json.loads(resp.data)["items"]

    def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._items(
            self.batch.list_namespaced_job(namespace, label_selector=selector, _preload_content=False)
        )

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._items(
            self.core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
        )

    def list_nodes(self, selector: str) -> list[dict[str, Any]]:
        return self._items(self.core.list_node(label_selector=selector, _preload_content=False))

    def create_job(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create a Job; False if it already exists (a restarted operator adopting its work)."""
        try:
            self.batch.create_namespaced_job(namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise

    def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            return self.core.read_namespaced_config_map(name, namespace).data or {}
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def apply_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        """Create or wholly replace: one write, so readers never see half an update."""
        try:
            self.core.create_namespaced_config_map(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.core.replace_namespaced_config_map(body["metadata"]["name"], namespace, body)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}
        )
