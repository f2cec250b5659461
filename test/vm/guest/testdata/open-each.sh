# open-each.sh DEV...: ibv_devinfo opens each device; its hca_id and port
# state lines, exit 1 at the first that fails.
for dev in "$@"; do
  ibv_devinfo -d "$dev" | grep -E 'hca_id|state' || exit 1
done
