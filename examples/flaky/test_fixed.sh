#!/bin/sh
# The fixed test: it waits until the service answers, and stops it afterwards.
cd "$(dirname "$0")"
python3 service.py &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
for i in $(seq 50); do
	if out=$(curl -sS --max-time 5 http://127.0.0.1:8765/ 2>/dev/null); then
		echo "$out"
		exit 0
	fi
	sleep 0.1
done
echo "the service did not answer in 5 s" >&2
exit 1
