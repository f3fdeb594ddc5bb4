#!/usr/bin/env python3
"""prune-fatbin.py SRC DST SM — a copy of a CUDA shared library (SRC) whose
embedded device code keeps only the entries of one GPU architecture (SM: 90
for Hopper), as nvprune does for static libraries: every fatbin container of
its .nv_fatbin and __nv_relfatbin sections keeps its place (the host code
points at each container's header) and its size; the kept entries move to its
front, the container's header gives their size, and the rest is zeroed. The
file keeps its length and its host code byte for byte, but compresses to the
one architecture's share (NCCL 2.30's libnccl.so.2: 252 MB, 38 MB under xz
instead of 150): what lets it travel to a GPU host in one carry
(scripts/fetch-nccl-ep.sh --carry). A GPU of another architecture finds no
kernel it can run in the copy. Exit 1 where no entry of SM is found."""
import struct
import sys

MAGIC = 0xBA55ED50  # a fatbin container's header: magic, version, header size, entries' size


def prune(data, sm):
    """Prune data (a bytearray of an ELF64 file) in place; returns (entries kept, dropped, bytes kept)."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(i):  # name offset, offset, size
        s = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        return s[0], s[4], s[5]

    strtab = section(shstrndx)[1]
    kept = dropped = kept_bytes = 0
    for i in range(shnum):
        name_at, off, size = section(i)
        name = bytes(data[strtab + name_at:data.index(b"\0", strtab + name_at)]).decode()
        if name not in (".nv_fatbin", "__nv_relfatbin"):
            continue
        p, end = off, off + size
        while p < end:
            magic, _, hsz, fsz = struct.unpack_from("<IHHQ", data, p)
            if magic != MAGIC:  # padding between containers (8-byte aligned)
                p += 8
                continue
            q, qend, keep = p + hsz, p + hsz + fsz, bytearray()
            while q < qend:  # an entry: kind, version, header size, payload size, ..., arch at 28
                _, _, ehsz, psz = struct.unpack_from("<HHIQ", data, q)
                arch, = struct.unpack_from("<I", data, q + 28)
                if arch == sm:
                    keep += data[q:q + ehsz + psz]
                    kept, kept_bytes = kept + 1, kept_bytes + psz
                else:
                    dropped += 1
                q += ehsz + psz
            if q != qend:
                sys.exit(f"prune-fatbin: a container at {p:#x} does not end where its header says")
            data[p + hsz:qend] = keep + bytes(qend - p - hsz - len(keep))
            struct.pack_into("<Q", data, p + 8, len(keep))
            p = qend
    return kept, dropped, kept_bytes


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, sm = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = bytearray(open(src, "rb").read())
    if data[:4] != b"\x7fELF" or data[4] != 2:
        sys.exit(f"prune-fatbin: {src} is not a 64-bit ELF file")
    kept, dropped, kept_bytes = prune(data, sm)
    if kept == 0:
        print(f"prune-fatbin: {src} has no device code for sm_{sm}", file=sys.stderr)
        sys.exit(1)
    with open(dst, "wb") as f:
        f.write(data)
    print(f"prune-fatbin: {dst}: kept {kept} sm_{sm} entries ({kept_bytes / 2**20:.1f} MiB), dropped {dropped}")


if __name__ == "__main__":
    main()
