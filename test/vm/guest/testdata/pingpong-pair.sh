# pingpong-pair.sh DEV GID PORT SERVER_IP: an ibv_rc_pingpong server and,
# once it listens (the kernel's /proc/net/tcp), its client in one
# container; exits 0 when both did.
dev=$1 gid=$2 port=$3 server=$4
listening=$(printf ':%04X 00000000:0000 0A' "$port")
ibv_rc_pingpong -d "$dev" -g "$gid" -p "$port" -n 500 -s 4096 &
for i in $(seq 200); do grep -q "$listening" /proc/net/tcp && break; sleep 0.1; done
ibv_rc_pingpong -d "$dev" -g "$gid" -p "$port" -n 500 -s 4096 "$server"; c=$?
wait $!; s=$?
echo client=$c server=$s; [ $c = 0 ] && [ $s = 0 ]
