# Debian packages, by CPack: from a build configured with
# -DCMAKE_INSTALL_PREFIX=/usr,
#     cpack --config build/CPackConfig.cmake -G DEB -B OUTDIR
# writes three packages (components: cmake/OvlDeploy.cmake):
#   ovl          ovld, ovlctl, ovl-demo, /etc/ovl/ovld.conf (a conffile), the
#                units in systemd's unit directory, sysusers.d and tmpfiles.d
#                snippets, the Slurm prolog and epilog as examples; its
#                maintainer scripts (deploy/debian/) make the user ovl and
#                reload systemd, and start nothing
#   libovl1      libovl.so.1 (package name from the soname), with shlibs
#   libovl-dev   <ovl/ovl.h>, libovl.so, libovl.a, ovl.pc
# Dependencies come from dpkg-shlibdeps (package dpkg-dev). Nothing here
# depends on CUDA: a build with -DOVL_CUDA=ON packages the same way, with
# ovld's CUDA and NCCL libraries among its dependencies (README.md, "Debian
# packages", says what that needs). tests/integration/test_package.py
# builds the packages of a CUDA-less build and runs lintian on them.

get_target_property(OVL_SOVERSION ovl SOVERSION)
set(OVL_DEB_VERSION ${PROJECT_VERSION})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ovl)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "the ovl authors")
# The Maintainer field: a placeholder, unless given with
# -DCPACK_PACKAGE_CONTACT="NAME <ADDRESS>" (a site that publishes the
# packages gives its own).
if(NOT CPACK_PACKAGE_CONTACT)
  set(CPACK_PACKAGE_CONTACT "ovl maintainers <ovl-maintainers@example.org>")
endif()
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${CPACK_PACKAGE_CONTACT}")
# Installed as for -DCMAKE_INSTALL_PREFIX=/usr, into a staging directory
# through DESTDIR, so that files outside the prefix (/etc/ovl, and systemd's
# /lib/systemd/system on Debian 12) land in the package at their paths.
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon lib dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)

# Each package's description below: its first line is the synopsis. CPack
# (3.25) would put the project's summary in front of each of them unless the
# summary is CPack's default, so it is left at that.
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${CPACK_PACKAGE_NAME} built using CMake")

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME ovl)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_DAEMON_DESCRIPTION
    "overlapped all-gather + GEMM offload daemon (ovld)
ovld runs the tensor-parallel column-linear pattern C = allgather(A) @ B for
the processes of a job, overlapping the all-gather with the matrix products.
This package holds ovld, ovlctl and ovl-demo, /etc/ovl/ovld.conf, the systemd
units (ovld.service, ovld.socket, ovld@.service, ovld@.socket,
ovld-user.service), the user ovl and the Slurm prolog and epilog as examples.
It enables and starts no unit.")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/deploy/debian/conffiles ${PROJECT_SOURCE_DIR}/deploy/debian/postinst
    ${PROJECT_SOURCE_DIR}/deploy/debian/prerm ${PROJECT_SOURCE_DIR}/deploy/debian/postrm)

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libovl${OVL_SOVERSION})
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
# ldconfig by dpkg's trigger, as Debian wants (CPack's own postinst and
# postrm call ldconfig as well, which lintian only warns about).
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/deploy/debian/triggers)
set(CPACK_DEBIAN_LIB_DESCRIPTION
    "client library of ovld, the overlapped all-gather + GEMM daemon
libovl registers an application's buffers with ovld, the node's ovl daemon,
and submits all-gather + GEMM operations ordered against the application's
own stream.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libovl-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_COMPONENT_DEV_DEPENDS lib)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libprotobuf-c-dev")
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "client library of ovld: development files
The header <ovl/ovl.h>, libovl.so and libovl.a, and ovl.pc for
pkg-config --cflags --libs ovl.")

# Every package's /usr/share/doc/PACKAGE: copyright and changelog.gz, as
# Debian asks of every binary package (in the packages only).
string(TIMESTAMP OVL_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/changelog.in
               ${PROJECT_BINARY_DIR}/debian/changelog @ONLY)
find_program(OVL_GZIP gzip)
if(OVL_GZIP)
  # -n: no name and time stamp in the header; -9 as Debian wants
  execute_process(COMMAND ${OVL_GZIP} -9nf ${PROJECT_BINARY_DIR}/debian/changelog)
  foreach(component daemon lib dev)
    string(TOUPPER ${component} c)
    install(FILES ${PROJECT_SOURCE_DIR}/deploy/debian/copyright ${PROJECT_BINARY_DIR}/debian/changelog.gz
            DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${CPACK_DEBIAN_${c}_PACKAGE_NAME}
            COMPONENT ${component} EXCLUDE_FROM_ALL)
  endforeach()
endif()

include(CPack)
