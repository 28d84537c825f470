"""GET/POST /api/v1/group-mappings/ and DELETE /api/v1/group-mappings/{id}/: administrators only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.audit.models import AuditEvent
from apps.identity.models import GroupMapping


def test_an_admin_maps_a_group_lists_and_deletes_it(admin: Any, vision: Any, api_as: Callable[..., Any]) -> None:
    client = api_as(admin, ["read", "admin"])
    created = client.post(
        "/api/v1/group-mappings/", {"group": "gpu-vision", "team": "vision", "role": "manager"}, format="json"
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["group"] == "gpu-vision" and body["team"] == "vision" and body["role"] == "manager"
    assert body["replaces_manual"] is False
    listed = client.get("/api/v1/group-mappings/").json()
    assert [(m["group"], m["team"], m["role"]) for m in listed] == [("gpu-vision", "vision", "manager")]
    assert client.delete(f"/api/v1/group-mappings/{body['id']}/").status_code == 204
    assert not GroupMapping.objects.exists()
    assert set(AuditEvent.objects.values_list("action", flat=True)) >= {
        "group_mapping.create",
        "group_mapping.delete",
    }


def test_the_role_defaults_to_member(admin: Any, vision: Any, api_as: Callable[..., Any]) -> None:
    response = api_as(admin, ["admin"]).post(
        "/api/v1/group-mappings/", {"group": "gpu-vision", "team": "vision"}, format="json"
    )
    assert response.status_code == 201 and response.json()["role"] == "member"


def test_an_unknown_team_or_role_is_a_validation_error(admin: Any, vision: Any, api_as: Callable[..., Any]) -> None:
    client = api_as(admin, ["admin"])
    no_team = client.post("/api/v1/group-mappings/", {"group": "g", "team": "nope"}, format="json")
    assert no_team.status_code == 400 and "team" in no_team.json()["fields"]
    bad_role = client.post("/api/v1/group-mappings/", {"group": "g", "team": "vision", "role": "owner"}, format="json")
    assert bad_role.status_code == 400 and "role" in bad_role.json()["fields"]


def test_the_same_group_and_team_twice_is_a_conflict(admin: Any, vision: Any, api_as: Callable[..., Any]) -> None:
    client = api_as(admin, ["admin"])
    first = client.post("/api/v1/group-mappings/", {"group": "g", "team": "vision"}, format="json")
    assert first.status_code == 201
    again = client.post("/api/v1/group-mappings/", {"group": "g", "team": "vision"}, format="json")
    assert again.status_code == 409
    assert GroupMapping.objects.count() == 1


def test_deleting_a_missing_mapping_is_404(admin: Any, api_as: Callable[..., Any]) -> None:
    assert api_as(admin, ["admin"]).delete("/api/v1/group-mappings/999999/").status_code == 404


def test_a_team_manager_cannot_map_groups(alice: Any, vision: Any, api_as: Callable[..., Any]) -> None:
    response = api_as(alice).post("/api/v1/group-mappings/", {"group": "g", "team": "vision"}, format="json")
    assert response.status_code == 403
    assert not GroupMapping.objects.exists()


def test_an_admin_token_without_the_admin_scope_cannot_list(admin: Any, api_as: Callable[..., Any]) -> None:
    assert api_as(admin, ["read"]).get("/api/v1/group-mappings/").status_code == 403


def test_admins_manage_mappings_in_the_admin(admin: Any, vision: Any) -> None:
    from django.test import Client

    client = Client()
    client.force_login(admin)
    assert client.get("/admin/identity/groupmapping/").status_code == 200
    response = client.post(
        "/admin/identity/groupmapping/add/",
        {"group": "gpu-vision", "team": vision.pk, "role": "manager", "replaces_manual": ""},
    )
    assert response.status_code == 302, response.content.decode()[:1000]
    assert GroupMapping.objects.get().role == "manager"
    assert client.get("/admin/identity/externalidentity/").status_code == 200
