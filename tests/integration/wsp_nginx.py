"""A throwaway nginx prefix around one http-level config file (deploy/nginx/wspush.conf or a
variant of it), so that a test can run `nginx -t` on it or start nginx from it as any user, with
every path nginx writes inside the prefix. Standard library only."""
from __future__ import annotations

import os
import tempfile


def nginx_prefix(http_conf: str) -> str:
    """Writes `http_conf` as wspush.conf and an nginx.conf that includes it (one worker, in the
    foreground, no access log) into a new temporary directory and returns the directory: run
    `nginx -p DIR -c DIR/nginx.conf`. The caller removes it."""
    tmp = tempfile.mkdtemp(prefix="wspush-nginx-")
    with open(os.path.join(tmp, "wspush.conf"), "w") as f:
        f.write(http_conf)
    with open(os.path.join(tmp, "nginx.conf"), "w") as f:
        f.write(f"daemon off;\nworker_processes 1;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log warn;\n"
                f"events {{ worker_connections 1024; }}\n"
                f"http {{\n  access_log off;\n  client_body_temp_path {tmp};\n  proxy_temp_path {tmp};\n"
                f"  fastcgi_temp_path {tmp};\n  uwsgi_temp_path {tmp};\n  scgi_temp_path {tmp};\n"
                f"  include {tmp}/wspush.conf;\n}}\n")
    return tmp
