"""Real servers for the identity tests: the portal under uvicorn on a port chosen in advance (the OIDC client's
redirect URI names it), the OpenID provider (tests/identity/oidc_provider.py) and Debian's slapd, each in its own
process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import ldap
import ldap.modlist

from tests.conftest import REPO, LiveServer, free_port, subprocess_env, wait_http

SLAPD = "/usr/sbin/slapd"
SLAPADD = "/usr/sbin/slapadd"
BASE_DN = "dc=lab,dc=test"
ROOT_DN = f"cn=admin,{BASE_DN}"
ROOT_PW = "directory-admin-pw"
PEOPLE = f"ou=people,{BASE_DN}"
GROUPS = f"ou=groups,{BASE_DN}"


def start_portal(port: int, **env: str) -> LiveServer:
    cmd = [sys.executable, "-m", "uvicorn", "portal.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--no-access-log", "--lifespan", "off", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(**env))
    server = LiveServer(proc, port)
    try:
        wait_http(server.url + "/api/v1/health", proc=proc)
    except Exception:
        server.stop()
        raise
    return server


@dataclass
class Provider:
    proc: subprocess.Popen[bytes]
    url: str

    def register_client(self, redirect_uri: str) -> tuple[str, str]:
        """Dynamic client registration (RFC 7591): the provider issues the client id and secret."""
        body = {"redirect_uris": [redirect_uri], "token_endpoint_auth_method": "client_secret_post"}
        doc = _post_json(self.url + "/oauth2/clients", body)
        return str(doc["client_id"]), str(doc["client_secret"])

    def set_user(self, sub: str, **claims: object) -> None:
        request = urllib.request.Request(
            f"{self.url}/users/{sub}",
            data=json.dumps(claims).encode(),
            headers={"Content-Type": "application/json"},
            method="PUT",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 204


def _post_json(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        doc: dict[str, object] = json.loads(response.read())
        return doc


@contextmanager
def oidc_provider(*, mode: str = "normal", token_max_age: int = 3600) -> Iterator[Provider]:
    port = free_port()
    cmd = [sys.executable, "-m", "tests.identity.oidc_provider", "--port", str(port), "--mode", mode]
    cmd += ["--token-max-age", str(token_max_age)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/.well-known/openid-configuration", proc=proc)
        yield Provider(proc, url)
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def oidc_portal(provider: Provider, *, client_secret: str | None = None, **env: str) -> Iterator[LiveServer]:
    """The portal as the provider's registered client (`client_secret` overrides the one it was issued)."""
    port = free_port()
    client_id, secret = provider.register_client(f"http://127.0.0.1:{port}/accounts/oidc/callback/")
    server = start_portal(
        port,
        OIDC_ISSUER_URL=provider.url,
        OIDC_CLIENT_ID=client_id,
        OIDC_CLIENT_SECRET=client_secret if client_secret is not None else secret,
        OIDC_PROVIDER_NAME="Lab SSO",
        **env,
    )
    try:
        yield server
    finally:
        server.stop()


# --- slapd --------------------------------------------------------------------------------------------

_SLAPD_CONF = """\
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/nis.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {dir}/slapd.pid
database mdb
maxsize 10485760
suffix "{base}"
rootdn "{root}"
rootpw {root_pw}
directory {dir}/db
access to attrs=userPassword by anonymous auth by self write by * none
access to * by users read by * none
"""

_BASE_LDIF = f"""\
dn: {BASE_DN}
objectClass: top
objectClass: dcObject
objectClass: organization
o: Lab
dc: lab

dn: {PEOPLE}
objectClass: organizationalUnit
ou: people

dn: {GROUPS}
objectClass: organizationalUnit
ou: groups
"""


@dataclass
class Directory:
    proc: subprocess.Popen[bytes]
    uri: str

    def _conn(self) -> ldap.ldapobject.LDAPObject:
        conn = ldap.initialize(self.uri)
        conn.simple_bind_s(ROOT_DN, ROOT_PW)
        return conn

    def add_person(
        self,
        uid: str,
        password: str,
        *,
        mail: str = "",
        given: str = "",
        sn: str = "Tester",
        uid_number: int | None = None,
    ) -> str:
        """An inetOrgPerson; with `uid_number`, a posixAccount too (nis schema: uidNumber, gidNumber and
        homeDirectory are required)."""
        dn = f"uid={uid},{PEOPLE}"
        attrs = {
            "objectClass": [b"inetOrgPerson"],
            "uid": [uid.encode()],
            "cn": [f"{given} {sn}".strip().encode()],
            "sn": [sn.encode()],
            "userPassword": [password.encode()],
        }
        if mail:
            attrs["mail"] = [mail.encode()]
        if given:
            attrs["givenName"] = [given.encode()]
        if uid_number is not None:
            attrs["objectClass"].append(b"posixAccount")
            attrs["uidNumber"] = [str(uid_number).encode()]
            attrs["gidNumber"] = [str(uid_number).encode()]
            attrs["homeDirectory"] = [f"/home/{uid}".encode()]
        conn = self._conn()
        conn.add_s(dn, ldap.modlist.addModlist(attrs))
        conn.unbind_s()
        return dn

    def add_group(self, cn: str, members: list[str]) -> str:
        """A groupOfNames (which needs at least one member: the directory admin stands in for an empty group)."""
        dn = f"cn={cn},{GROUPS}"
        attrs = {
            "objectClass": [b"groupOfNames"],
            "cn": [cn.encode()],
            "member": [m.encode() for m in members] or [ROOT_DN.encode()],
        }
        conn = self._conn()
        conn.add_s(dn, ldap.modlist.addModlist(attrs))
        conn.unbind_s()
        return dn

    def add_posix_group(self, cn: str, gid: int, uids: list[str]) -> str:
        dn = f"cn={cn},{GROUPS}"
        attrs = {"objectClass": [b"posixGroup"], "cn": [cn.encode()], "gidNumber": [str(gid).encode()]}
        if uids:
            attrs["memberUid"] = [u.encode() for u in uids]
        conn = self._conn()
        conn.add_s(dn, ldap.modlist.addModlist(attrs))
        conn.unbind_s()
        return dn

    def set_posix_members(self, group_cn: str, uids: list[str]) -> None:
        conn = self._conn()
        if uids:
            conn.modify_s(f"cn={group_cn},{GROUPS}", [(ldap.MOD_REPLACE, "memberUid", [u.encode() for u in uids])])
        else:
            conn.modify_s(f"cn={group_cn},{GROUPS}", [(ldap.MOD_DELETE, "memberUid", None)])
        conn.unbind_s()

    def set_uid_number(self, uid: str, uid_number: int) -> None:
        """Change the uidNumber of a person added with one."""
        conn = self._conn()
        conn.modify_s(f"uid={uid},{PEOPLE}", [(ldap.MOD_REPLACE, "uidNumber", [str(uid_number).encode()])])
        conn.unbind_s()

    def set_members(self, group_cn: str, members: list[str]) -> None:
        conn = self._conn()
        values = [m.encode() for m in members] or [ROOT_DN.encode()]
        conn.modify_s(f"cn={group_cn},{GROUPS}", [(ldap.MOD_REPLACE, "member", values)])
        conn.unbind_s()

    def portal_env(self) -> dict[str, str]:
        return {
            "LDAP_SERVER_URI": self.uri,
            "LDAP_BIND_DN": ROOT_DN,
            "LDAP_BIND_PASSWORD": ROOT_PW,
            "LDAP_USER_SEARCH_BASE": PEOPLE,
            "LDAP_GROUP_SEARCH_BASE": GROUPS,
        }


@contextmanager
def slapd() -> Iterator[Directory]:
    """Debian's slapd on a loopback port, its database in a temporary folder, loaded with slapadd."""
    if shutil.which(SLAPD) is None:
        raise RuntimeError("slapd is not installed (scripts/ensure-system-packages.sh installs it)")
    folder = Path(tempfile.mkdtemp(prefix="portal-slapd-"))
    try:
        (folder / "db").mkdir()
        conf = folder / "slapd.conf"
        conf.write_text(_SLAPD_CONF.format(dir=folder, base=BASE_DN, root=ROOT_DN, root_pw=ROOT_PW))
        (folder / "base.ldif").write_text(_BASE_LDIF)
        subprocess.run([SLAPADD, "-f", str(conf), "-l", str(folder / "base.ldif")], check=True, capture_output=True)
        port = free_port()
        uri = f"ldap://127.0.0.1:{port}"
        proc = subprocess.Popen([SLAPD, "-f", str(conf), "-h", uri + "/", "-d", "0"], stderr=subprocess.DEVNULL)
        directory = Directory(proc, uri)
        try:
            _wait_ldap(directory)
            yield directory
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _wait_ldap(directory: Directory, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if directory.proc.poll() is not None:
            raise RuntimeError(f"slapd exited with {directory.proc.returncode}")
        try:
            directory._conn().unbind_s()
            return
        except ldap.SERVER_DOWN:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
