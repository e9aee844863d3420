"""Print the VLAN id and ethertype of the next N frames from one MAC to
another on an interface. The kernel moves a received 802.1Q tag out of
the frame into packet metadata, so a plain packet socket cannot see it:
this reads it from PACKET_AUXDATA, as tcpdump does.

usage: vlan_listen.py IFACE SRC_MAC_HEX DST_MAC_HEX N
(prints "ready" first, then one "VLAN ETHERTYPE" line per frame, VLAN
"none" when untagged)
"""
import socket
import struct
import sys

SOL_PACKET, PACKET_AUXDATA, ETH_P_ALL = 263, 8, 3
TP_STATUS_VLAN_VALID = 1 << 4

iface, src, dst = sys.argv[1], bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
count = int(sys.argv[4])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
s.bind((iface, 0))
s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
s.settimeout(5)
print("ready", flush=True)
seen = 0
while seen < count:
    data, ancillary, _, _ = s.recvmsg(65535, socket.CMSG_SPACE(32))
    if data[6:12] != src or data[0:6] != dst:
        continue
    vlan = "none"
    for level, kind, aux in ancillary:
        if level == SOL_PACKET and kind == PACKET_AUXDATA:
            status, _, _, _, _, tci, _ = struct.unpack("IIIHHHH", aux[:20])
            if status & TP_STATUS_VLAN_VALID:
                vlan = str(tci & 0xFFF)
    print(f"{vlan} {data[12:14].hex()}", flush=True)
    seen += 1
