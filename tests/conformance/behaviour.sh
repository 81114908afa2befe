#!/usr/bin/env bash
# Behaviour checks for tests/conformance/run --suite behaviour: run as root in an empty
# directory on the filesystem under test (the one argument), each check prints "## NAME" and
# then what it observed. The runner runs this on kernel ext4 and on rext4 and compares each
# check's output; nothing here knows which filesystem it is on.
set -u
dir=$1
cd "$dir" || exit 2
umask 022
# Error messages without the program and file names, so outputs compare across mounts.
msg() { sed 's/.*: //'; }
as_nobody() { su -s /bin/sh nobody -c "$1" 2>&1 | msg; }

check() { echo "## $1"; }

check acl_default_inherited
mkdir acl_d && setfacl -d -m u:nobody:rwx acl_d
touch acl_d/f && mkdir acl_d/sub
getfacl -cp acl_d/f acl_d/sub 2>&1

check acl_access_enforced
mkdir acl_e && chmod 700 acl_e && touch acl_e/x && setfacl -m u:nobody:rx acl_e
as_nobody "ls $dir/acl_e"

check acl_set_updates_mode
touch acl_m && setfacl -m u:nobody:rwx acl_m && stat -c '%a' acl_m

check acl_chmod_updates_acl
touch acl_c && setfacl -m u:nobody:rwx acl_c && chmod 640 acl_c && getfacl -cp acl_c

check o_trunc_running_executable
# The open must come once the program runs (a loaded machine can take a while to exec it).
cp /usr/bin/sleep exe
./exe 3 &
pid=$!
for _ in $(seq 100); do
    [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(pwd -P)/exe" ] && break
    sleep 0.05
done
python3 -c "
import os
try: os.open('exe', os.O_RDONLY | os.O_TRUNC); print('opened')
except OSError as e: print(os.strerror(e.errno))
print('size', os.stat('exe').st_size)"
wait "$pid"
echo "exit status $?"

check ioctl_getversion_int
touch gv && python3 -c "
import fcntl, os, struct
fd = os.open('gv', os.O_RDONLY)
buf = bytearray(b'\xaa' * 16)
fcntl.ioctl(fd, 0x80087601, buf)  # FS_IOC_GETVERSION
print('bytes written', sum(1 for b in buf if b != 0xaa) <= 4 and 'at most 4' or 'more than 4')"

check o_tmpfile
python3 -c "
import os
try:
    fd = os.open('.', os.O_TMPFILE | os.O_RDWR, 0o600); os.write(fd, b'abc')
    print('size', os.fstat(fd).st_size)
except OSError as e: print(os.strerror(e.errno))"

check unlinked_open_file_changes
python3 -c "
import os
fd = os.open('gone', os.O_CREAT | os.O_RDWR, 0o644)
os.unlink('gone')
for step in (lambda: os.setxattr(fd, 'user.k', b'set after unlink'),
             lambda: os.fchmod(fd, 0o600),
             lambda: os.ftruncate(fd, 4096),
             lambda: os.write(fd, b'data')):
    try: step(); print('ok')
    except OSError as e: print(os.strerror(e.errno))
st = os.fstat(fd)
print(os.getxattr(fd, 'user.k'), oct(st.st_mode & 0o7777), st.st_size, st.st_nlink)"

check sparse_file_blocks
truncate -s 1G sparse && printf x | dd of=sparse bs=1 seek=536870912 conv=notrunc status=none
printf y | dd of=sparse bs=1 seek=4096 conv=notrunc status=none
stat -c '%s %b' sparse

check special_files
mknod cdev c 1 3 && mknod bdev b 7 0 && mkfifo fifo
python3 -c "import socket; s = socket.socket(socket.AF_UNIX); s.bind('sock')"
stat -c '%n %F %t:%T %a' cdev bdev fifo sock

check readdir_types
mkdir dt && touch dt/f && mkdir dt/d && ln -s f dt/l && mkfifo dt/p && mknod dt/c c 1 3
find dt -mindepth 1 -printf '%f %y\n' | sort

check xattr_listing
touch xl && for k in zeta alpha mid b a; do setfattr -n user.$k -v "v$k" xl; done
setfattr -n user.big -v "$(printf '%3000s' '' | tr ' ' x)" xl
getfattr -d --absolute-names xl | cut -c1-40

check link_counts
mkdir lc && mkdir lc/a lc/b lc/c && touch lc/f && ln lc/f lc/g && ln lc/f lc/h
stat -c '%n %h' lc lc/a lc/f

check long_symlink
ln -s "$(printf '%4095s' '' | tr ' ' a)" longlink && readlink longlink | wc -c
ln -s "$(printf '%4096s' '' | tr ' ' a)" toolong 2>&1 | msg

check punch_hole_blocks
head -c 65536 /dev/urandom >ph && sync ph && stat -c '%b' ph
fallocate -p -o 8192 -l 16384 ph && stat -c '%s %b' ph

check inode_flags
touch fl && chattr +d +A +s +S fl 2>&1 | msg; lsattr fl 2>&1 | cut -d' ' -f1

check size_limits
truncate -s 16T big1 2>&1 | msg; stat -c '%s' big1 2>&1 | msg
truncate -s 17592186040320 big2 2>&1 | msg; stat -c '%s' big2 2>&1 | msg
printf x | dd of=big3 bs=1 seek=17592186040320 status=none 2>&1 | msg

check o_direct
head -c 1048576 /dev/urandom >od_src
dd if=od_src of=od bs=65536 oflag=direct status=none 2>&1 | msg
dd if=od bs=65536 iflag=direct status=none 2>&1 | cmp - od_src && echo same

check copy_file_range_data
head -c 300000 /dev/urandom >cfr_a && truncate -s 500000 cfr_a
python3 -c "
import os
a = os.open('cfr_a', os.O_RDONLY); b = os.open('cfr_b', os.O_CREAT | os.O_WRONLY, 0o644)
n = 0
while True:
    k = os.copy_file_range(a, b, 1 << 20)
    if k == 0: break
    n += k
print('copied', n)"
cmp cfr_a cfr_b && echo same; stat -c '%s' cfr_b

check rename_errors
mkdir re && mkdir re/sub && touch re/f
mv -T re re/sub/x 2>&1 | msg
python3 -c "
import os
for a, b in (('re', 're/sub/y'), ('re/f', 're/sub'), ('re/sub', 're/f'), ('re', '.')):
    try: os.rename(a, b); print('renamed')
    except OSError as e: print(os.strerror(e.errno))"

check times_each_change_moves
mkdir tm && printf 'abc' >tm/f && mkdir tm/sub
python3 -c "
import os, subprocess, time
os.chdir('tm')
def t(p):
    st = os.lstat(p); return (st.st_mtime_ns, st.st_ctime_ns)
steps = [
    ('write', 'f', lambda: open('f', 'a').write('more')),
    ('chmod', 'f', lambda: os.chmod('f', 0o600)),
    ('chown_same', 'f', lambda: os.chown('f', -1, -1)),
    ('setxattr', 'f', lambda: os.setxattr('f', 'user.x', b'1')),
    ('chattr', 'f', lambda: subprocess.run(['chattr', '+d', 'f'], check=True)),
    ('utime_atime', 'f', lambda: os.utime('f', ns=(1, os.lstat('f').st_mtime_ns))),
    ('truncate_same', 'f', lambda: os.truncate('f', os.lstat('f').st_size)),
    ('truncate_grow', 'f', lambda: os.truncate('f', 100)),
    ('link_file', 'f', lambda: os.link('f', 'g')),
    ('link_dir', '.', lambda: os.link('f', 'h')),
    ('rename_file', 'g', lambda: os.rename('g', 'g2')),  # measured as g2 after
    ('rename_dir', '.', lambda: os.rename('g2', 'g3')),
    ('unlink_file', 'f', lambda: os.unlink('h')),
    ('mkdir_parent', '.', lambda: os.mkdir('d2')),
    ('rmdir_parent', '.', lambda: os.rmdir('d2')),
    ('rename_subdir', 'sub', lambda: os.rename('sub', 'sub2')),  # measured as sub2 after
    ('listing', '.', lambda: os.listdir('.')),
    ('read', 'f', lambda: open('f').read()),
]
moved_to = {'rename_file': 'g2', 'rename_subdir': 'sub2'}
for name, path, op in steps:
    before = t(path); time.sleep(0.05); op(); after = t(moved_to.get(name, path))
    print(name, 'm', 'moved' if after[0] != before[0] else 'kept', 'c', 'moved' if after[1] != before[1] else 'kept')
"

check removed_directory
mkdir rd && python3 -c "
import os
d = os.open('rd', os.O_RDONLY | os.O_DIRECTORY)
os.rmdir('rd')
for name, op in (('create', lambda: os.close(os.open('x', os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=d))),
                 ('mkdir', lambda: os.mkdir('y', dir_fd=d)),
                 ('symlink', lambda: os.symlink('t', 'z', dir_fd=d)),
                 ('list', lambda: print(sorted(os.listdir(d)))),
                 ('stat', lambda: print(os.fstat(d).st_nlink))):
    try: op(); print(name, 'ok')
    except OSError as e: print(name, os.strerror(e.errno))"

check directory_errors
mkdir de && mkdir de/a de/b && touch de/b/f
python3 -c "
import os
for name, op in (('rename_over_nonempty', lambda: os.rename('de/a', 'de/b')),
                 ('open_dir_for_write', lambda: os.open('de', os.O_WRONLY)),
                 ('rmdir_nonempty', lambda: os.rmdir('de/b')),
                 ('rmdir_dot', lambda: os.rmdir('de/a/.')),
                 ('unlink_dir', lambda: os.unlink('de/a')),
                 ('link_dir', lambda: os.link('de/a', 'de/c')),
                 ('mkdir_existing', lambda: os.mkdir('de/a'))):
    try: op(); print(name, 'ok')
    except OSError as e: print(name, os.strerror(e.errno))"

check mmap_shared_write
head -c 20000 /dev/zero >mm && python3 -c "
import mmap, os
fd = os.open('mm', os.O_RDWR)
m = mmap.mmap(fd, 20000)
m[100:105] = b'hello'; m[15000:15005] = b'world'; m.flush(); m.close(); os.close(fd)
d = open('mm', 'rb').read()
print(d[100:105], d[15000:15005], len(d))"

check data_edges
python3 -c "
import os, hashlib
def h(b): return hashlib.sha256(b).hexdigest()[:12]
r = bytes((i * 7919) % 251 for i in range(20000))
fd = os.open('edges', os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, r)
os.ftruncate(fd, 5003); os.ftruncate(fd, 12000)
print('regrown tail zero', os.pread(fd, 6997, 5003) == bytes(6997))
os.pwrite(fd, b'z', 100001)
print('gap zero', os.pread(fd, 100001 - 12000, 12000) == bytes(100001 - 12000), os.fstat(fd).st_size)
import fcntl
os.pwrite(fd, r, 0)
libc_punch = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | KEEP_SIZE
os.posix_fallocate(fd, 0, 1)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print('punch', libc.fallocate(fd, libc_punch, ctypes.c_long(1000), ctypes.c_long(6000)))
print('zero range', libc.fallocate(fd, 0x10, ctypes.c_long(15000), ctypes.c_long(3000)))
d = os.pread(fd, 20000, 0)
print(h(d[:1000]) == h(r[:1000]), d[1000:7000] == bytes(6000), d[7000:15000] == r[7000:15000], d[15000:18000] == bytes(3000), d[18000:] == r[18000:20000])
a = os.open('edges', os.O_WRONLY | os.O_APPEND)
os.lseek(a, 0, 0); os.write(a, b'APP')
print('append at', os.fstat(a).st_size, os.pread(fd, 3, os.fstat(a).st_size - 3))"

check xattr_flags
touch xf && python3 -c "
import os
for name, op in (('create_new', lambda: os.setxattr('xf', 'user.a', b'1', os.XATTR_CREATE)),
                 ('create_existing', lambda: os.setxattr('xf', 'user.a', b'2', os.XATTR_CREATE)),
                 ('replace_missing', lambda: os.setxattr('xf', 'user.b', b'2', os.XATTR_REPLACE)),
                 ('replace_existing', lambda: os.setxattr('xf', 'user.a', b'3', os.XATTR_REPLACE)),
                 ('remove_missing', lambda: os.removexattr('xf', 'user.b')),
                 ('empty_value', lambda: os.setxattr('xf', 'user.e', b'')),
                 ('long_name', lambda: os.setxattr('xf', 'user.' + 'n' * 250, b'v')),
                 ('too_long_name', lambda: os.setxattr('xf', 'user.' + 'n' * 256, b'v')),
                 ('unknown_namespace', lambda: os.setxattr('xf', 'bogus.x', b'v'))):
    try: op(); print(name, 'ok')
    except OSError as e: print(name, os.strerror(e.errno))
print(sorted(os.listxattr('xf')) == sorted(['user.a', 'user.e', 'user.' + 'n' * 250]), os.getxattr('xf', 'user.a'), os.getxattr('xf', 'user.e'))"

check no_space
dd if=/dev/zero of=fill bs=1M status=none 2>&1 | msg
printf more >>fill 2>&1 | msg
python3 -c "
import os
try: os.posix_fallocate(os.open('falloc_full', os.O_CREAT | os.O_WRONLY, 0o644), 0, 1 << 20); print('fallocate ok')
except OSError as e: print('fallocate', os.strerror(e.errno))"
rm -f fill falloc_full && sync && dd if=/dev/zero of=after bs=1M count=8 status=none 2>&1 | msg && stat -c '%s' after

check replaced_open_target
printf old >rt_target && printf new >rt_src
python3 -c "
import os
fd = os.open('rt_target', os.O_RDONLY)
os.rename('rt_src', 'rt_target')
print(os.read(fd, 10), os.fstat(fd).st_nlink, open('rt_target').read())"

check concurrent_appends
for w in 1 2 3; do (for i in $(seq 1 500); do echo "writer $w line $i" >>appends; done) & done; wait
wc -l <appends; sort appends | uniq -d | wc -l

check big_directory_listing
mkdir bigd && (cd bigd && seq -f 'entry-%05g-with-a-longer-name' 1 3000 | xargs touch)
ls -U bigd | wc -l; ls -U bigd | sort | md5sum | cut -c1-12
rm bigd/entry-0150* && ls -U bigd | wc -l

check preallocation
printf 'abc' >pa && fallocate -n -o 0 -l 1048576 pa && stat -c '%s %b' pa
fallocate -l 65536 pb && python3 -c "
import os
fd = os.open('pb', os.O_RDWR)
os.pwrite(fd, b'mid', 30000); os.fsync(fd)
# Before anything reads the unwritten rest: ext4 counts cached pages of unwritten extents
# as data, so a read first would make its answer depend on its page cache.
print(os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE), os.lseek(fd, 28672, os.SEEK_HOLE))
d = os.pread(fd, 65536, 0)
print(d[:30000] == bytes(30000), d[30000:30003], d[30003:] == bytes(65536 - 30003))"
stat -c '%s %b' pb

check symlink_opens
ln -s target_new dangling && ln -s pa_link_t pal
python3 -c "
import os
for name, op in (('creat_through_dangling', lambda: os.close(os.open('dangling', os.O_CREAT | os.O_WRONLY, 0o644))),
                 ('excl_on_dangling', lambda: os.open('pal', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)),
                 ('nofollow', lambda: os.open('dangling', os.O_RDONLY | os.O_NOFOLLOW)),
                 ('trailing_slash_file', lambda: os.stat('pa/')),
                 ('mkdir_trailing_slash', lambda: os.mkdir('newdir/'))):
    try: op(); print(name, 'ok')
    except OSError as e: print(name, os.strerror(e.errno))
print(os.path.exists('target_new'), os.path.isdir('newdir'))"

check directory_moves
mkdir mv1 mv2 && mkdir mv1/sub && touch mv1/sub/f
mv mv1/sub mv2/ && stat -c '%n %h' mv1 mv2 mv2/sub && ls mv2/sub/.. && cd mv2/sub/.. && pwd -P | sed 's|.*/||' && cd "$dir"

check sticky_directory
mkdir st && chmod 1777 st && touch st/roots && chmod 666 st/roots
as_nobody "rm -f $dir/st/roots; mv $dir/st/roots $dir/st/x; echo hi >> $dir/st/roots && echo appended; touch $dir/st/mine && rm $dir/st/mine && echo own removed"
ls st

check data_round_trip
tmp=$(mktemp) && head -c 20000000 /dev/urandom >"$tmp"
cp "$tmp" rt_big && cmp "$tmp" rt_big && echo same
python3 -c "
import os
fd = os.open('rt_parts', os.O_CREAT | os.O_RDWR, 0o644)
pids = []
for w in range(4):
    pid = os.fork()
    if pid == 0:
        for i in range(w, 256, 4):
            os.pwrite(fd, bytes([i]) * 4099, i * 4099)
        os._exit(0)
    pids.append(pid)
for p in pids: os.waitpid(p, 0)
d = os.pread(fd, 256 * 4099 + 1, 0)
print(len(d), all(d[i * 4099:(i + 1) * 4099] == bytes([i]) * 4099 for i in range(256)))"
rm -f "$tmp"

check fallocate_collapse_insert
head -c 65536 /dev/urandom >falloc
fallocate -c -o 0 -l 4096 falloc 2>&1 | msg
fallocate -i -o 0 -l 4096 falloc 2>&1 | msg
stat -c '%s' falloc

check statx_btime
touch bt && stat -c '%W' bt | sed 's/^[1-9][0-9]*$/set/'

check mount_type
findmnt -no FSTYPE -T . | sed 's/^ext4$/ext4-or-fuse.rext4/; s/^fuse\.rext4$/ext4-or-fuse.rext4/'

check suid_cleared_by_other_writer
touch w && chmod 6777 w && as_nobody "echo hi >> $dir/w" && stat -c '%a' w

check suid_cleared_by_other_truncate
touch w2 && chmod 6777 w2 && as_nobody "truncate -s 10 $dir/w2" && stat -c '%a' w2

check sgid_directory_inheritance
mkdir g && chown :daemon g && chmod 2775 g && mkdir g/s && touch g/f
stat -c '%n %a %G' g/s g/f

check xattr_namespaces
touch x
setfattr -n trusted.t -v 1 x 2>&1 | msg
setfattr -n security.s -v 2 x 2>&1 | msg
setfattr -n user.u -v 3 x 2>&1 | msg
getfattr -d -m - x 2>&1 | sort
ln -s x sl && setfattr -h -n user.u -v 1 sl 2>&1 | msg
setfattr -n user.huge -v "$(head -c 70000 /dev/zero | tr '\0' a)" x 2>&1 | msg

check chattr_immutable_append
touch ci && chattr +i ci && { echo y >ci; } 2>&1 | msg
rm -f ci 2>&1 | msg
chattr -i ci && touch ca && chattr +a ca && echo a >>ca && { echo b >ca; } 2>&1 | msg
chattr -a ca && lsattr ci ca 2>&1 | cut -c1-22

check seek_data_hole
python3 -c "
import os
fd = os.open('sp', os.O_CREAT | os.O_RDWR); os.pwrite(fd, b'x', 1 << 20)
print(os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE))
try: os.lseek(fd, (1 << 20) + 1, os.SEEK_DATA)
except OSError as e: print(os.strerror(e.errno))"

check rename_flags
touch e1 e2 && python3 -c "
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for name, flag in (('noreplace', 1), ('exchange', 2), ('whiteout', 4)):
    r = libc.renameat2(-100, b'e1', -100, b'e3' if flag == 4 else b'e2', flag)
    print(name, r, ctypes.get_errno() if r else 0)"
stat -c '%F %t:%T' e1 2>&1 | msg

check names_and_links
touch "$(printf 'a%.0s' $(seq 255))" && echo name255 ok
touch "$(printf 'a%.0s' $(seq 256))" 2>&1 | msg
mkdir n n/1 n/2 && stat -c 'dir nlink %h' n
ln n n2 2>&1 | msg
rmdir n 2>&1 | msg
mkdir r1 r1/r2 && mv r1 r1/r2/ 2>&1 | msg

check statfs_shape
stat -f -c 'bsize %S namelen %l' .
