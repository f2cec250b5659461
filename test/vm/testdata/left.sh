# left.sh: what the driver left on the node once the kubelet has
# unprepared (up to 2 minutes): the CDI specs in /node/cdi on one line,
# then the checkpoint, in the termination message.
for i in $(seq 240); do [ -z "$(ls /node/cdi)" ] && break; sleep 0.5; done
{ echo "cdi: $(ls /node/cdi | tr '\n' ' ')"; cat /node/plugin/checkpoint.json; } > /dev/termination-log
