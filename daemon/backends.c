/*
 * backends.c: choosing a backend (backend/backend.h), the one place that
 * knows both implementations; with main.c, the top of ovld.
 */
#include <stdio.h>

#include "backend.h"
#include "report.h"

ovl_status_t ovld_backend_create(uv_loop_t *loop, const ovld_config_t *cfg, ovld_done_cb done_cb,
                                 void *done_arg, const ovld_reporter_t *report,
                                 ovld_backend_t **ret, char *err, size_t errlen)
{
    switch (cfg->backend) {
    case OVLD_BACKEND_HOST:
        return ovld_backend_host_create(loop, cfg, done_cb, done_arg, report, ret, err, errlen);
    case OVLD_BACKEND_CUDA:
#ifdef OVL_HAVE_CUDA
        return ovld_backend_cuda_create(loop, cfg, done_cb, done_arg, report, ret, err, errlen);
#else
        snprintf(err, errlen, "backend = cuda, but this ovld was built without CUDA");
        return OVL_ERR_UNSUPPORTED;
#endif
    case OVLD_BACKEND_AUTO:
#ifdef OVL_HAVE_CUDA
    {
        char why[256] = "";
        ovl_status_t st =
            ovld_backend_cuda_create(loop, cfg, done_cb, done_arg, report, ret, why, sizeof(why));
        if (st == OVL_OK)
            return OVL_OK;
        /* Not a failure: auto asked for whichever backend works. */
        ovld_report(report, OVLD_REPORT_INFO, "no usable GPU (%s): using the host backend", why);
    }
#endif
        return ovld_backend_host_create(loop, cfg, done_cb, done_arg, report, ret, err, errlen);
    }
    snprintf(err, errlen, "unknown backend %d", (int)cfg->backend);
    return OVL_ERR_CONFIG;
}
