#!/usr/bin/env bash
# MariaDB 10.11 (Debian) on 127.0.0.1:$MARIADB_PORT: tests/services/server.sh mariadb10 ACTION.
#   tests/services/mariadb.sh up|down|status
exec "$(dirname "${BASH_SOURCE[0]}")/server.sh" mariadb10 "$@"
