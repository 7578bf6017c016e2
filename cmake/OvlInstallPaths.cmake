# Run by `cmake --install` (and by cpack), not at configure time: the files
# whose text names installed paths, written for the prefix of the install
# itself. `cmake --install build --prefix P` installs the units, ovld.conf
# and ovl.pc for P even when CMake was configured with another prefix.
#
# Set by the install(CODE) that includes this file (cmake/OvlDeploy.cmake):
#   OVL_PART               "deploy" (ovld.conf and the units) or "pkgconfig"
#   OVL_SOURCE_DIR         the source tree (deploy/ holds the templates)
#   OVL_BINARY_DIR         where the filled-in files are written
#   OVL_SBINDIR, OVL_SYSCONFDIR, OVL_LIBDIR, OVL_INCLUDEDIR
#                          CMAKE_INSTALL_<dir> as configured (relative to the
#                          prefix, or absolute where the builder said so)
#   OVL_UNIT_DIR, OVL_USER_UNIT_DIR
#                          OVL_SYSTEMD_[USER_]UNIT_DIR as configured (empty:
#                          the default below)
#   OVL_SYSTEMD_PC_UNIT_DIR, OVL_SYSTEMD_PC_USER_UNIT_DIR
#                          systemd.pc's directories on the build machine
#   OVL_VERSION            the project's version
# CMAKE_INSTALL_PREFIX is the prefix of this install; file(INSTALL) adds
# $DESTDIR in front of every destination by itself.

# ovl_full_dir(VAR DIR SYSTEM): GNUInstallDirs' CMAKE_INSTALL_FULL_<dir>
# rule, applied to the install's prefix. An absolute DIR stays as it is. With
# SYSTEM (sysconfdir): prefix / or /usr gives /DIR (/etc), /opt/NAME gives
# /DIR/opt/NAME (/etc/opt/NAME), any other prefix PREFIX/DIR.
function(ovl_full_dir var dir system)
  set(prefix "${CMAKE_INSTALL_PREFIX}")
  string(REGEX REPLACE "/+$" "" prefix "${prefix}")
  if(IS_ABSOLUTE "${dir}")
    set(full "${dir}")
  elseif(system AND (prefix STREQUAL "" OR prefix STREQUAL "/usr"))
    set(full "/${dir}")
  elseif(system AND prefix MATCHES "^/opt/(.*)")
    set(full "/${dir}/opt/${CMAKE_MATCH_1}")
  else()
    set(full "${prefix}/${dir}")
  endif()
  set(${var} "${full}" PARENT_SCOPE)
endfunction()

# ovl_unit_dir(VAR CONFIGURED SYSTEMD_PC DEFAULT): where a kind of unit goes.
# CONFIGURED (OVL_SYSTEMD_*UNIT_DIR) wins; else systemd's own directory from
# systemd.pc for prefix /usr; else PREFIX/DEFAULT.
function(ovl_unit_dir var configured systemd_pc default)
  string(REGEX REPLACE "/+$" "" prefix "${CMAKE_INSTALL_PREFIX}")
  if(configured)
    ovl_full_dir(dir "${configured}" FALSE)
  elseif(prefix STREQUAL "/usr" AND systemd_pc)
    set(dir "${systemd_pc}")
  else()
    ovl_full_dir(dir "${default}" FALSE)
  endif()
  set(${var} "${dir}" PARENT_SCOPE)
endfunction()

ovl_full_dir(SBINDIR "${OVL_SBINDIR}" FALSE)
ovl_full_dir(SYSCONFDIR "${OVL_SYSCONFDIR}" TRUE)
set(out "${OVL_BINARY_DIR}/ovl-install")

if(OVL_PART STREQUAL "deploy")
  # ovld.conf where every unit's --config looks for it.
  file(INSTALL DESTINATION "${SYSCONFDIR}/ovl" TYPE FILE FILES "${OVL_SOURCE_DIR}/deploy/ovld.conf")
  # The units: @SBINDIR@ and @SYSCONFDIR@ of this install.
  foreach(unit ovld.service ovld.socket ovld@.service ovld@.socket ovld-user.service)
    configure_file("${OVL_SOURCE_DIR}/deploy/${unit}" "${out}/${unit}" @ONLY)
  endforeach()
  ovl_unit_dir(unit_dir "${OVL_UNIT_DIR}" "${OVL_SYSTEMD_PC_UNIT_DIR}" lib/systemd/system)
  ovl_unit_dir(user_unit_dir "${OVL_USER_UNIT_DIR}" "${OVL_SYSTEMD_PC_USER_UNIT_DIR}" lib/systemd/user)
  file(INSTALL DESTINATION "${unit_dir}" TYPE FILE
       FILES "${out}/ovld.service" "${out}/ovld.socket" "${out}/ovld@.service" "${out}/ovld@.socket")
  file(INSTALL DESTINATION "${user_unit_dir}" TYPE FILE FILES "${out}/ovld-user.service")
elseif(OVL_PART STREQUAL "pkgconfig")
  # ovl.pc with this install's absolute paths: right for a multiarch libdir
  # (lib/x86_64-linux-gnu) and, under PKG_CONFIG_SYSROOT_DIR, for a tree
  # staged with DESTDIR.
  ovl_full_dir(LIBDIR "${OVL_LIBDIR}" FALSE)
  ovl_full_dir(INCLUDEDIR "${OVL_INCLUDEDIR}" FALSE)
  string(REGEX REPLACE "/+$" "" PREFIX "${CMAKE_INSTALL_PREFIX}")
  if(PREFIX STREQUAL "")
    set(PREFIX "/")
  endif()
  # ${prefix}-relative where the directory lies under the prefix, as
  # Debian's own .pc files are written.
  foreach(v LIBDIR INCLUDEDIR)
    string(LENGTH "${PREFIX}/" n)
    string(SUBSTRING "${${v}}/" 0 ${n} head)
    if(NOT PREFIX STREQUAL "/" AND head STREQUAL "${PREFIX}/")
      string(SUBSTRING "${${v}}" ${n} -1 rest)
      set(${v} "\${prefix}/${rest}")
    endif()
  endforeach()
  set(PROJECT_VERSION "${OVL_VERSION}")
  configure_file("${OVL_SOURCE_DIR}/deploy/ovl.pc.in" "${out}/ovl.pc" @ONLY)
  ovl_full_dir(pcdir "${OVL_LIBDIR}/pkgconfig" FALSE)
  file(INSTALL DESTINATION "${pcdir}" TYPE FILE FILES "${out}/ovl.pc")
else()
  message(FATAL_ERROR "OvlInstallPaths.cmake: unknown OVL_PART '${OVL_PART}'")
endif()
