# What `cmake --install` puts on a node besides the programs and the library
# (daemon/ and client/ install those): ovld.conf, the systemd units, the
# sysusers.d and tmpfiles.d snippets, the Slurm examples and ovl.pc. Every
# rule names the component of the Debian package it belongs to
# (cmake/OvlPackage.cmake):
#   daemon  package ovl: ovld, ovlctl, ovl-demo, ovld.conf, the units, the
#           snippets, the Slurm examples
#   lib     package libovl1: libovl.so.1 (the soname) and its file
#   dev     package libovl-dev: <ovl/ovl.h>, libovl.so, libovl.a, ovl.pc
# A plain `cmake --install` installs every component.
#
# Paths: ovld.conf goes to GNUInstallDirs' CMAKE_INSTALL_FULL_SYSCONFDIR for
# the install's prefix: /etc/ovl/ovld.conf for prefix /usr (and /), PREFIX/etc
# otherwise (/etc/opt/NAME for /opt/NAME). The units name ovld and ovld.conf
# by absolute paths, and ovl.pc the library's; all three are written when
# the install runs (cmake/OvlInstallPaths.cmake), for the prefix it installs
# to, so that `cmake --install build --prefix P` gives units and an ovl.pc
# that point into P whatever prefix was configured.

set(OVL_SYSTEMD_UNIT_DIR "" CACHE PATH
    "where the system units go (empty: systemd.pc's systemdsystemunitdir for prefix /usr, else PREFIX/lib/systemd/system)")
set(OVL_SYSTEMD_USER_UNIT_DIR "" CACHE PATH
    "where ovld-user.service goes (empty: systemd.pc's systemduserunitdir for prefix /usr, else PREFIX/lib/systemd/user)")
# systemd's own directories on this machine (Debian 12: /lib/systemd/system
# and /usr/lib/systemd/user), used when the install's prefix is /usr.
pkg_get_variable(OVL_SYSTEMD_PC_UNIT_DIR systemd systemdsystemunitdir)
pkg_get_variable(OVL_SYSTEMD_PC_USER_UNIT_DIR systemd systemduserunitdir)

# ovl_install_paths(PART COMPONENT): cmake/OvlInstallPaths.cmake's PART, run
# at install time with what it needs from this configuration.
function(ovl_install_paths part component)
  set(vars "")
  foreach(v OVL_SOURCE_DIR=${PROJECT_SOURCE_DIR} OVL_BINARY_DIR=${PROJECT_BINARY_DIR}
            OVL_SBINDIR=${CMAKE_INSTALL_SBINDIR} OVL_SYSCONFDIR=${CMAKE_INSTALL_SYSCONFDIR}
            OVL_LIBDIR=${CMAKE_INSTALL_LIBDIR} OVL_INCLUDEDIR=${CMAKE_INSTALL_INCLUDEDIR}
            OVL_UNIT_DIR=${OVL_SYSTEMD_UNIT_DIR} OVL_USER_UNIT_DIR=${OVL_SYSTEMD_USER_UNIT_DIR}
            OVL_SYSTEMD_PC_UNIT_DIR=${OVL_SYSTEMD_PC_UNIT_DIR}
            OVL_SYSTEMD_PC_USER_UNIT_DIR=${OVL_SYSTEMD_PC_USER_UNIT_DIR}
            OVL_VERSION=${PROJECT_VERSION} OVL_PART=${part})
    string(REGEX MATCH "^[^=]*" name "${v}")
    string(REGEX REPLACE "^[^=]*=" "" value "${v}")
    string(APPEND vars "set(${name} [==[${value}]==])\n")
  endforeach()
  install(CODE "${vars}include([==[${PROJECT_SOURCE_DIR}/cmake/OvlInstallPaths.cmake]==])"
          COMPONENT ${component})
endfunction()

# ovld.conf and the units (package ovl); ovl.pc (package libovl-dev).
# ovld.service and ovld.socket: the node-wide ovld (user ovl); ovld@.service
# and ovld@.socket: one ovld per user (GPU nodes under CUDA MPS);
# ovld-user.service: a user's own, under `systemctl --user`.
ovl_install_paths(deploy daemon)
ovl_install_paths(pkgconfig dev)

# systemd: the ovl user and group (sysusers.d), /run/ovl (tmpfiles.d).
install(FILES deploy/ovl.sysusers DESTINATION lib/sysusers.d RENAME ovl.conf COMPONENT daemon)
install(FILES deploy/ovl.tmpfiles DESTINATION lib/tmpfiles.d RENAME ovl.conf COMPONENT daemon)
# Examples, to be copied and adapted: the Slurm prolog and epilog that start
# and stop ovld@UID.service for each user's jobs.
install(PROGRAMS deploy/slurm/ovl-prolog.sh deploy/slurm/ovl-epilog.sh
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples/slurm COMPONENT daemon)
