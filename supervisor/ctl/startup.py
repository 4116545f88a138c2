"""`herder run`'s start-up, before the watchdog: settle the configuration (the run-as user,
the state dir, an embedded Redis when none is given), lock the state dir, then replace this
process (exec) with the watchdog. No click here: the command (cli.py) turns a ConfigError or a
held lock into its exit code and message.

The exec keeps the pid a service manager started as the watchdog's, which is what systemd's
Type=notify and KillMode=mixed need. It keeps this process's children too: the master
`herder run` started before it loaded click (herder.common.config.prestart) is handed the settled
configuration here, just before the exec, and the watchdog adopts it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import sys
from dataclasses import replace
from pathlib import Path

from herder.common import handover, statelock
from herder.common.config import ENV_RESOLVED, Config, ConfigError, prestart
from herder.common.uplink_protocol import MASTER_RESTARTS_ENV

MAX_SOCKET_PATH = 103  # sun_path is 104 bytes on macOS, 108 on Linux, with its NUL

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


# Where a service installed by `herder install-service` keeps its state (its unit's --state-dir):
# systemd's StateDirectory=herder, and launchd's usual place for a daemon's state on macOS.
SERVICE_STATE_DIRS = {"systemd": "/var/lib/herder", "launchd": "/usr/local/var/herder"}


def default_state_dir() -> str:
    """`herder run`'s state dir when none is given: runtime state of this user."""
    if os.geteuid() == 0:
        return "/run/herder"
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return os.path.join(base, f"herder-{os.getuid()}")


def service_state_dir() -> str:
    """The state dir of the service `install-service` writes for this platform."""
    return SERVICE_STATE_DIRS["launchd" if sys.platform == "darwin" else "systemd"]


def state_dirs_to_try() -> list[str]:
    """Where a bare `herder status|stop|scale|...` looks for a herder, in order: one started by
    hand with the default (`herder run`), then the installed service's."""
    return list(dict.fromkeys([default_state_dir(), service_state_dir()]))


def check_user(name: str, source: str = "default") -> pwd.struct_passwd | None:
    """The user to run as (None: this one); ConfigError naming where the name came from."""
    if not name:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError("user", f"no such user: {name!r}", source) from None
    if os.geteuid() != 0 and entry.pw_uid != os.geteuid():
        raise ConfigError("user", f"only root can run herder as another user ({name!r})", source)
    return entry


def prepare_state_dir(path: str, owner: pwd.struct_passwd | None = None) -> str:
    """The state dir holds the control socket and logs: 0700, ours, not a symlink."""
    p = Path(path).absolute()
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    uid = owner.pw_uid if owner else os.geteuid()
    if owner and p.lstat().st_uid != uid and not p.is_symlink():
        os.chown(p, owner.pw_uid, owner.pw_gid)  # the master runs as this user and writes here
    st = p.lstat()
    if p.is_symlink() or st.st_uid != uid:
        raise ConfigError("state_dir", f"{p} must be a directory owned by uid {uid}, not a symlink")
    if st.st_mode & 0o077:
        os.chmod(p, 0o700)
    longest = os.path.join(str(p), "herder.sock")
    if len(longest.encode()) > MAX_SOCKET_PATH:
        raise ConfigError(
            "state_dir",
            f"{p} is too long: the control socket path would exceed "
            f"{MAX_SOCKET_PATH} bytes, the limit for Unix sockets",
        )
    return str(p)


def settle(cfg: Config, sources: dict[str, str] | None = None) -> pwd.struct_passwd | None:
    """What `herder run` decides before anything starts, in `cfg`: the state dir (made 0700 and
    ours), an embedded Redis when no URL is given. Returns the user to run as (None: this one).
    Raises ConfigError naming the key."""
    owner = check_user(cfg.user, (sources or {}).get("user", "default"))
    if not cfg.state_dir:
        cfg.defaulted.append("state_dir")  # a reload compares the file's silence, not this path
    cfg.state_dir = prepare_state_dir(cfg.state_dir or default_state_dir(), owner)
    if cfg.redis_url is None:
        # No Redis given: the watchdog runs a private one in the state dir.
        import herder.watchdog.embedded_redis as embedded_redis  # only now: every command starts faster

        if shutil.which("redis-server") is None:
            raise ConfigError(
                "redis_url", f"not set, and no redis-server on PATH. {embedded_redis.INSTALL_HINT}"
            )
        cfg.embedded_redis = True
        cfg.redis_url = embedded_redis.url_for(cfg.state_dir)
    return owner


def lock_state_dir(state_dir: str, owner: pwd.struct_passwd | None) -> int:
    """One herder per state dir (herder.common.statelock): the lock's descriptor, before
    anything of this one starts. Raises statelock.Locked naming the live herder, or OSError."""
    fd = statelock.acquire(state_dir)
    if owner:
        os.fchown(fd, owner.pw_uid, owner.pw_gid)  # like the state dir: that user may run herder there later
    return fd


def exec_watchdog(cfg: Config, lock_fd: int) -> None:
    """Become the watchdog, handing it the resolved settings and the state dir's lock."""
    # The settings that may carry a password are in the config now: they go no further down
    # (a job's code can read its environment).
    # So is the dashboard's token (herder.supervisor.control.http_auth): the master takes it from the
    # config. Named in prestart.py, as `herder run` imports http_auth's hashing and cookie
    # parsing (~30 ms) no more.
    env = {k: v for k, v in os.environ.items() if k not in prestart.SECRET_ENV}
    env[ENV_RESOLVED] = replace(cfg, http_token=os.environ.get(prestart.TOKEN_ENV, "")).to_json()
    early = prestart.taken()
    if early and (cfg.embedded_redis or (cfg.user and os.geteuid() == 0)):
        early.dismiss()  # the watchdog's loop starts this master (after Redis; as the user)
    elif early:
        # The master `herder run` started before click loads now: the environment and the
        # config the watchdog would have started it with (watchdog/early.py).
        env.update(early.hand_over({**env, MASTER_RESTARTS_ENV: "0"}))
    env, config_fd = handover.seal(env)
    assert config_fd is not None
    env[statelock.ENV_LOCK_FD] = str(lock_fd)
    for fd in (lock_fd, config_fd):  # through this exec only: the watchdog reads the config's and
        os.set_inheritable(fd, True)  # closes it, and makes the lock's close-on-exec again
    sys.stderr.flush()
    # As PID 1 (a container) a signal with no handler is dropped: a SIGTERM while the watchdog
    # starts would be lost. Blocked, it stays pending through the exec until the watchdog's
    # handlers are in place (it unblocks them then: watchdog/core.py, install_signals).
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    os.execve(sys.executable, [sys.executable, "-P", "-m", "herder.watchdog"], env)
