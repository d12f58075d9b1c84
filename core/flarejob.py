"""The FL job folder a federated job's every run submits: the one the kernel generates around a
Client API script, or the tenant's own NVFlare job folder mapped onto the job's sites.

Either way the kernel adds the same two server components (:data:`KERNEL_PERSISTOR`,
:data:`ROUND_WRITER`, shipped as :data:`COMPONENT_MODULE`) and takes charge of the *training
workflow*'s rounds and persistor:

* ``num_rounds`` and ``start_round`` are the run's (the job's ``rounds``, minus those done when a run
  restarts): whatever the folder says is replaced.
* ``persistor_id`` names the kernel's persistor, which starts the run from the model the kernel chose
  (the initial model of round 1; after a restart, the global model of the last round done) and
  otherwise delegates to the tenant's persistor (its ``load`` gives round 1's model when the job has
  no ``initial_model``; its ``save`` is called as the workflow calls it).
* The round writer hears the global model of every round (NVFlare's ``AFTER_SHAREABLE_TO_LEARNABLE``,
  which ``FedAvg``, ``ScatterAndGather`` and their kin fire) and writes it where the federation
  service turns it into a ``checkpointed`` event. So the kernel sees every round whatever persistor
  and aggregator the tenant uses; the round's aggregated metrics only where the aggregation result is
  an ``FLModel`` (``FedAvg`` and other ``ModelController`` workflows), else none.

The training workflow of a tenant's folder is the server workflow that names ``num_rounds`` (at most
one may), else its first. It must accept ``num_rounds``, ``start_round`` and ``persistor_id`` (NVFlare's
``FedAvg`` and ``ScatterAndGather`` do) and must not pass ``model`` (it would override the model a
restarted run resumes from).

Sites: the kernel's clients are ``site-1`` .. ``site-N``. A ``deploy_map`` target that is one of them
stays; other client names take the remaining ones in the order they appear; ``@ALL`` is the server and
every site. Every site must end up with exactly one client app, and exactly one app goes to the server.
Only JSON is read (``meta.json``, ``config/config_fed_server.json``, ``config/config_fed_client.json``).

Pure: documents in, documents out. :mod:`ops.federation.runs` writes them.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from core.errors import ResontechError

COMPONENT_MODULE = "resontech_flare"
"""The kernel's server components, shipped into the server app of every run
(``ops/federation/resontech_flare.py``)."""
KERNEL_PERSISTOR = "resontech_persistor"
ROUND_WRITER = "resontech_rounds"
TENANT_PERSISTOR = "persistor"
"""The component id of a ``federated.persistor`` in a generated job (NVFlare's usual id)."""
SERVER_APP = "app_server"
CLIENT_APP = "app_client"
META = "meta.json"
SERVER_CONFIG = "config/config_fed_server.json"
CLIENT_CONFIG = "config/config_fed_client.json"
MAX_FILES = 2000
MAX_BYTES = 200 * 1024 * 1024
"""Limits on the training code a job ships (a script's folder, a job folder, a persistor's folder)."""
_PERSISTOR = re.compile(r"^(?P<key>[^:]+\.py):(?P<cls>[A-Za-z_][A-Za-z0-9_]*)$")
_VARIABLE = re.compile(r"^\{(\w+)\}$")


class JobFolderInvalid(ResontechError, ValueError):
    """The tenant's job folder cannot run; the message says what to fix."""

    code = "job_folder_invalid"


@dataclass(frozen=True)
class FlJob:
    """A job's FL job folder, before a run's specifics (:func:`run_documents`).

    Attributes:
        server_app: the app deployed to the server.
        deploy_map: app -> targets, with the job's own site names.
        sites: every client, all required.
        documents: the JSON the kernel writes into every run's folder, by path inside it: the server
            app's config (and, for a generated job, the client app's).
        workflow: index of the training workflow among the server config's ``workflows``.
        inner_persistor: component id of the tenant's persistor, or ``""``.
    """

    server_app: str
    deploy_map: dict[str, list[str]]
    sites: list[str]
    documents: dict[str, dict[str, Any]]
    workflow: int
    inner_persistor: str

    @property
    def server_config(self) -> str:
        return f"{self.server_app}/{SERVER_CONFIG}"


@dataclass(frozen=True)
class PersistorRef:
    """A ``federated.persistor``: ``key`` of its file, imported as ``module`` from its folder."""

    key: str
    module: str
    cls: str

    @property
    def folder(self) -> str:
        """The workspace prefix shipped with it (its file's folder; ``""`` for the top)."""
        parent = str(PurePosixPath(self.key).parent)
        return "" if parent == "." else parent + "/"


def persistor_ref(spec: str) -> PersistorRef:
    """Parse ``path/to/file.py:ClassName``.

    Raises:
        ValueError: not of that form, or the file's name is not an importable module name.
    """
    match = _PERSISTOR.match(spec)
    if match is None:
        raise ValueError(f"persistor {spec!r} must be <workspace key of a .py file>:<class name>")
    key = match["key"]
    module = PurePosixPath(key).stem
    if not module.isidentifier():
        raise ValueError(f"persistor file {key!r}: {module!r} is not an importable module name")
    return PersistorRef(key=key, module=module, cls=match["cls"])


def code_problem(objects: Iterable[tuple[str, int]], what: str) -> str | None:
    """Too many files or bytes in training code ``what`` (``(key, size)`` of each object)."""
    listed = list(objects)
    if len(listed) > MAX_FILES or sum(size for _, size in listed) > MAX_BYTES:
        return f"{what} holds more than {MAX_FILES} files or {MAX_BYTES // 2**20} MiB"
    return None


def folder_problems(objects: Iterable[tuple[str, int]], prefix: str) -> list[str]:
    """What the listing of job folder ``prefix`` (``(key, size)`` of each object under it) shows to
    be wrong: no ``meta.json``, no app with a server or a client config, too large."""
    listed = [(key[len(prefix) :], size) for key, size in objects if key.startswith(prefix)]
    names = {name for name, _ in listed}
    problems = []
    if META not in names:
        other = sorted(n for n in names if "/" not in n and n.startswith("meta."))
        hint = f" ({', '.join(other)}: only JSON is read)" if other else ""
        problems.append(f"no {META} at its top{hint}")
    for config, role in ((SERVER_CONFIG, "server"), (CLIENT_CONFIG, "client")):
        if not any(name.count("/") == 2 and name.endswith("/" + config) for name in names):
            problems.append(f"no app with {config} (the {role} side)")
    too_big = code_problem(listed, "it")
    return [*problems, *([too_big] if too_big else [])]


def config_paths(names: Iterable[str]) -> list[str]:
    """The files of a job folder (paths inside it) that :func:`tenant_job` reads."""
    configs = ("/" + SERVER_CONFIG, "/" + CLIENT_CONFIG)
    return sorted(n for n in names if n == META or (n.count("/") == 2 and n.endswith(configs)))


# -- a tenant's job folder --------------------------------------------------------------------------


def tenant_job(files: Mapping[str, bytes], sites: list[str]) -> FlJob:
    """The tenant's job folder as the kernel runs it, from its ``meta.json`` and app configs
    (:func:`config_paths`, by path inside the folder).

    Raises:
        JobFolderInvalid: see the module docstring for the rules.
    """
    meta = _json_object(files, META)
    deploy_map = meta.get("deploy_map")
    if not isinstance(deploy_map, dict) or not deploy_map:
        raise JobFolderInvalid(f'{META} has no deploy_map (app -> ["server", client names...])')
    for app, targets in deploy_map.items():
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise JobFolderInvalid(f"{META}: deploy_map[{app!r}] must be a list of names")
        if not any(path.startswith(f"{app}/config/") for path in files):
            raise JobFolderInvalid(f"{META}: deploy_map names app {app!r}, which has no {app}/config/")
    mapped = map_sites(deploy_map, sites)
    server_app = _server_app(mapped)
    for site in sites:
        apps = [app for app, targets in mapped.items() if site in targets]
        if len(apps) != 1:
            got = f"apps {', '.join(apps)}" if apps else "no app"
            raise JobFolderInvalid(f"{site} gets {got} from the deploy_map: each site runs exactly one")
        if f"{apps[0]}/{CLIENT_CONFIG}" not in files:
            raise JobFolderInvalid(f"app {apps[0]!r} runs on {site} but has no {CLIENT_CONFIG}")
    path = f"{server_app}/{SERVER_CONFIG}"
    if path not in files:
        raise JobFolderInvalid(f"app {server_app!r} runs on the server but has no {SERVER_CONFIG}")
    config = _json_object(files, path)
    workflow = training_workflow(config, path)
    inner = _inner_persistor(config, config["workflows"][workflow], path)
    return FlJob(
        server_app=server_app,
        deploy_map=mapped,
        sites=list(sites),
        documents={path: config},
        workflow=workflow,
        inner_persistor=inner,
    )


def map_sites(deploy_map: Mapping[str, list[str]], sites: list[str]) -> dict[str, list[str]]:
    """``deploy_map`` with its client names turned into the job's ``sites`` (module docstring).

    Raises:
        JobFolderInvalid: it names more clients than the job has sites.
    """
    named = list(dict.fromkeys(t for ts in deploy_map.values() for t in ts if t not in ("server", "@ALL")))
    foreign = [name for name in named if name not in sites]
    free = [site for site in sites if site not in named]
    if len(foreign) > len(free):
        raise JobFolderInvalid(
            f"the deploy_map names {len(named)} clients ({', '.join(named)}) but the job has "
            f"{len(sites)} shards ({', '.join(sites)}): ask for more shards or name fewer clients"
        )
    rename = dict(zip(foreign, free, strict=False))
    mapped: dict[str, list[str]] = {}
    for app, targets in deploy_map.items():
        out: list[str] = []
        for target in targets:
            out += ["server", *sites] if target == "@ALL" else [rename.get(target, target)]
        mapped[app] = list(dict.fromkeys(out))
    return mapped


def _server_app(deploy_map: Mapping[str, list[str]]) -> str:
    servers = [app for app, targets in deploy_map.items() if "server" in targets]
    if len(servers) != 1:
        which = ", ".join(servers) if servers else "none"
        raise JobFolderInvalid(f"exactly one app must be deployed to the server (deploy_map: {which})")
    return servers[0]


def _json_object(files: Mapping[str, bytes], path: str) -> dict[str, Any]:
    if path not in files:
        raise JobFolderInvalid(f"no {path}")
    try:
        document = json.loads(files[path])
    except (ValueError, UnicodeDecodeError) as exc:
        raise JobFolderInvalid(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise JobFolderInvalid(f"{path} must hold a JSON object")
    return document


def _value(config: Mapping[str, Any], value: Any) -> Any:
    """``value`` with NVFlare's ``"{name}"`` reference to a top-level config entry resolved."""
    if isinstance(value, str) and (match := _VARIABLE.match(value)) and match[1] in config:
        return config[match[1]]
    return value


def training_workflow(config: Mapping[str, Any], path: str) -> int:
    """Index of the training workflow in a server config (module docstring).

    Raises:
        JobFolderInvalid: no workflows, several naming ``num_rounds``, or one passing ``model``.
    """
    workflows = config.get("workflows")
    if not isinstance(workflows, list) or not workflows or not all(isinstance(w, dict) for w in workflows):
        raise JobFolderInvalid(f"{path} has no workflows")
    rounds = [i for i, w in enumerate(workflows) if "num_rounds" in (w.get("args") or {})]
    if len(rounds) > 1:
        ids = ", ".join(str(workflows[i].get("id", i)) for i in rounds)
        raise JobFolderInvalid(f"{path}: workflows {ids} all set num_rounds: which one trains?")
    index = rounds[0] if rounds else 0
    if "model" in (workflows[index].get("args") or {}):
        raise JobFolderInvalid(
            f"{path}: the training workflow passes model, which would override the global model a "
            "restarted run resumes from; give it as federated.initial_model (or load it in a persistor)"
        )
    return index


def _inner_persistor(config: Mapping[str, Any], workflow: Mapping[str, Any], path: str) -> str:
    components = config.get("components") or []
    if not isinstance(components, list) or not all(isinstance(c, dict) for c in components):
        raise JobFolderInvalid(f"{path}: components must be a list of objects")
    ids = {c.get("id") for c in components}
    for own in (KERNEL_PERSISTOR, ROUND_WRITER):
        if own in ids:
            raise JobFolderInvalid(f"{path}: the component id {own!r} is the kernel's; rename yours")
    args = workflow.get("args") or {}
    if "persistor_id" not in args:
        return TENANT_PERSISTOR if TENANT_PERSISTOR in ids else ""
    inner = _value(config, args["persistor_id"])
    if inner and inner not in ids:
        raise JobFolderInvalid(f"{path}: the training workflow's persistor_id {inner!r} is not a component")
    return str(inner or "")


# -- the generated job --------------------------------------------------------------------------------


def script_job(
    *,
    sites: list[str],
    script: str,
    script_args: list[str],
    framework: str,
    persistor: PersistorRef | None = None,
) -> FlJob:
    """The job folder the kernel generates around a Client API script.

    The server runs NVFlare's own ``FedAvg`` (weighted by each client's ``NUM_STEPS_CURRENT_ROUND``,
    which the scripts set to their sample count), with the tenant's persistor when it has one (its
    folder goes into ``app_server/custom/``). Each client runs the script in its own process with
    NVFlare's Client API executor; the tenant's files go into ``app_client/custom/``.

    Args:
        sites: every client, all required.
        script: the script's path inside ``app_client/custom/``.
        script_args: its arguments; NVFlare splits them on whitespace, so none may contain any.
        framework: ``numpy`` or ``pytorch`` (the format the script exchanges; the server sees arrays).
        persistor: the tenant's persistor, if any.
    """
    controller = {
        "id": "controller",
        "path": "nvflare.app_common.workflows.fedavg.FedAvg",
        "args": {"num_clients": len(sites)},
    }
    components = []
    if persistor is not None:
        components.append({"id": TENANT_PERSISTOR, "path": f"{persistor.module}.{persistor.cls}", "args": {}})
    server = {"format_version": 2, "workflows": [controller], "components": components}
    executor = {
        "path": "nvflare.app_common.executors.client_api_executor.ClientAPIExecutor",
        "args": {
            "execution_mode": "in_process",
            "task_script_path": script,
            "task_script_args": " ".join(script_args),
            "params_exchange_format": "pytorch" if framework == "pytorch" else "numpy",
            "server_expected_format": "numpy",
        },
    }
    client = {"format_version": 2, "executors": [{"tasks": ["*"], "executor": executor}], "components": []}
    return FlJob(
        server_app=SERVER_APP,
        deploy_map={SERVER_APP: ["server"], CLIENT_APP: list(sites)},
        sites=list(sites),
        documents={f"{SERVER_APP}/{SERVER_CONFIG}": server, f"{CLIENT_APP}/{CLIENT_CONFIG}": client},
        workflow=0,
        inner_persistor=TENANT_PERSISTOR if persistor is not None else "",
    )


# -- one run ------------------------------------------------------------------------------------------


def run_documents(
    job: FlJob, *, name: str, first_round: int, rounds: int, out_dir: str, start_model: str | None
) -> dict[str, dict[str, Any]]:
    """The JSON documents of one run's folder, by path inside it: ``meta.json``, and the server
    config with the kernel's rounds, persistor and round writer (module docstring).

    Args:
        name: the run's NVFlare job name.
        first_round: the 1-based round the run starts at.
        rounds: rounds to run.
        out_dir: absolute path the round writer writes ``round-NNNNN.npz``/``.json`` into.
        start_model: absolute path (on the server) of the model the run starts from, if the kernel
            chose one.
    """
    documents = copy.deepcopy(job.documents)
    server = documents[job.server_config]
    workflow = server["workflows"][job.workflow]
    args = workflow.setdefault("args", {})
    args.update(num_rounds=rounds, start_round=first_round - 1, persistor_id=KERNEL_PERSISTOR)
    if not start_model and not job.inner_persistor:
        args["allow_empty_global_weights"] = True  # the clients start from their own weights
    server["components"] = [
        *(server.get("components") or []),
        {
            "id": KERNEL_PERSISTOR,
            "path": f"{COMPONENT_MODULE}.StartingPersistor",
            "args": {"start_model": start_model or "", "inner": job.inner_persistor},
        },
        {"id": ROUND_WRITER, "path": f"{COMPONENT_MODULE}.RoundWriter", "args": {"out_dir": out_dir}},
    ]
    meta = {
        "name": name,
        "resource_spec": {},
        "min_clients": len(job.sites),
        "required_sites": list(job.sites),
        "deploy_map": job.deploy_map,
    }
    return {META: meta, **documents}
