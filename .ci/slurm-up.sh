#!/usr/bin/env bash
# Start a two-node SLURM cluster on this machine (munge, slurmctld, two slurmd) for the job-chain
# tests. Best effort: without root or packages it says why and leaves the test to skip.
set -u
if ! command -v slurmctld > /dev/null; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null; then
    echo "slurm-up: no slurmctld and no root apt-get: the SLURM test will be skipped"; exit 0
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge \
    > /tmp/slurm-up-apt.log 2>&1 || { echo "slurm-up: apt-get failed (see /tmp/slurm-up-apt.log)"; exit 0; }
fi
if [ "$(id -u)" -ne 0 ]; then echo "slurm-up: not root: the SLURM test will be skipped"; exit 0; fi
if sinfo -h > /dev/null 2>&1; then echo "slurm-up: already running"; exit 0; fi
mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
pgrep -x munged > /dev/null || runuser -u munge -- /usr/sbin/munged --force
host=$(hostname -s)
cpus=$(nproc)
memory=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
conf_dir=/etc/slurm
[ -d /etc/slurm-llnl ] && [ ! -d /etc/slurm ] && conf_dir=/etc/slurm-llnl
mkdir -p "$conf_dir"
cat > "$conf_dir/slurm.conf" <<CONF
ClusterName=tuneforge
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmdPidFile=/var/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmdParameters=config_overrides
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
ReturnToService=2
KillWait=10
MinJobAge=600
InactiveLimit=0
OverTimeLimit=0
MpiDefault=none
NodeName=tf-node1 NodeHostname=$host NodeAddr=127.0.0.1 Port=17001 CPUs=$cpus RealMemory=$memory State=UNKNOWN
NodeName=tf-node2 NodeHostname=$host NodeAddr=127.0.0.1 Port=17002 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=tf-node1,tf-node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
mkdir -p /var/spool/slurmd/tf-node1 /var/spool/slurmd/tf-node2
slurmctld
# two slurmd on this one machine: the multi-node test's two nodes (their jobs share its cores)
slurmd -N tf-node1
slurmd -N tf-node2
for _ in $(seq 1 30); do
  if [ "$(sinfo -h -N -o %T 2>/dev/null | grep -c idle)" -ge 2 ]; then
    echo "slurm-up: two-node cluster ready on $host"; exit 0
  fi
  sleep 1
done
echo "slurm-up: the node did not become idle (see /var/log/slurm): the SLURM test will be skipped"
exit 0
